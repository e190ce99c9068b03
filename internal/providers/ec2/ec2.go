// Package ec2 is a provider of Amazon EC2 machines through the official
// AWS SDK for Go v2: offers are the region's instance types
// (DescribeInstanceTypes), claim launches one instance of a type
// (RunInstances, idempotent by the claim key as its client token), identify
// finds an instance of the account (DescribeInstances, tagged with the
// account), release terminates it.
//
// It cannot bootstrap: delivering the node daemon to a running instance
// needs a channel into it (SSM, or user data at launch before a join token
// exists), which this build does not have, so providerAccounts.bootstrap
// answers UNSUPPORTED for its accounts.
//
// The secret access key is a reference (secretAccessKey ends in key): it
// is resolved each time the SDK asks for credentials, never kept.
package ec2

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"computeplane/internal/providers"
)

// Name is the provider's registered name.
const Name = "ec2"

// AccountTag is the tag naming the provider account on every instance it
// launches; identify finds only instances that carry the account's.
const AccountTag = "computeplane:account"

// ConfigSchema is the JSON Schema of an account's config.
const ConfigSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["region", "accessKeyId", "secretAccessKey"],
  "properties": {
    "region": {"type": "string", "pattern": "^[a-z]{2}(-[a-z]+)+-[0-9]$"},
    "accessKeyId": {"type": "string", "pattern": "^[A-Z0-9]{16,128}$"},
    "secretAccessKey": {"type": "string"},
    "sessionToken": {"type": "string"},
    "endpoint": {"type": "string", "pattern": "^https?://[^/?#@]+(/[^?#@]*)?$", "description": "another EC2 endpoint (tests, compatible clouds)"},
    "imageId": {"type": "string", "pattern": "^ami-[0-9a-f]{8,32}$", "description": "the image claimed machines boot"},
    "subnetId": {"type": "string", "pattern": "^subnet-[0-9a-f]{8,32}$"},
    "securityGroupIds": {"type": "array", "maxItems": 5, "items": {"type": "string", "pattern": "^sg-[0-9a-f]{8,32}$"}},
    "instanceTypes": {"type": "array", "maxItems": 100, "items": {"type": "string", "pattern": "^[a-z0-9]+[a-z0-9-]*\\.[a-z0-9]+$"},
      "description": "offer only these types (default: every type of the region)"}
  }
}`

// Manifest is the provider's manifest.
var Manifest = providers.Manifest{
	Name:         Name,
	Description:  "Amazon EC2 instances",
	ConfigSchema: ConfigSchema,
	Capabilities: []providers.Capability{providers.CapOffers, providers.CapIdentify, providers.CapClaim, providers.CapRelease},
}

// Factory makes clients of accounts of this provider; the main lists it
// among the providers built in (internal/builtin).
var Factory = &providers.Factory{Manifest: Manifest, New: New}

// Config is an account's config.
type Config struct {
	Region           string   `json:"region"`
	AccessKeyID      string   `json:"accessKeyId"`
	SecretAccessKey  string   `json:"secretAccessKey"` // a reference
	SessionToken     string   `json:"sessionToken"`    // a reference
	Endpoint         string   `json:"endpoint"`
	ImageID          string   `json:"imageId"`
	SubnetID         string   `json:"subnetId"`
	SecurityGroupIDs []string `json:"securityGroupIds"`
	InstanceTypes    []string `json:"instanceTypes"`
}

// Provider is a client of one account.
type Provider struct {
	env providers.Env
	cfg Config
	api *ec2.Client
}

// Timeout bounds one EC2 call (the SDK retries within it).
const Timeout = 30 * time.Second

// New builds a client from an account's config.
func New(env providers.Env, raw json.RawMessage) (providers.Provider, error) {
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("ec2: config: %w", err)
	}
	if env.Resolve == nil {
		return nil, errors.New("ec2: no reference resolver")
	}
	p := &Provider{env: env, cfg: c}
	opts := ec2.Options{
		Region:      c.Region,
		Credentials: aws.CredentialsProviderFunc(p.credentials),
		HTTPClient:  &http.Client{Timeout: Timeout},
	}
	if c.Endpoint != "" {
		opts.BaseEndpoint = aws.String(c.Endpoint)
	}
	p.api = ec2.New(opts)
	return p, nil
}

// credentials resolves the references at each signing: a rotated secret
// is used by the next call, and no value outlives the call.
func (p *Provider) credentials(ctx context.Context) (aws.Credentials, error) {
	secret, err := p.env.Resolve(ctx, p.cfg.SecretAccessKey)
	if err != nil {
		return aws.Credentials{}, err
	}
	creds := aws.Credentials{AccessKeyID: p.cfg.AccessKeyID, SecretAccessKey: secret, Source: "computeplane provider account"}
	if p.cfg.SessionToken != "" {
		if creds.SessionToken, err = p.env.Resolve(ctx, p.cfg.SessionToken); err != nil {
			return aws.Credentials{}, err
		}
	}
	return creds, nil
}

// Close has nothing to end.
func (p *Provider) Close() {}

// Offers lists the region's instance types (or the config's), narrowed on
// EC2's side by bare-metal for a kind and by the configured types.
func (p *Provider) Offers(ctx context.Context, q providers.Query) ([]providers.Offer, error) {
	in := &ec2.DescribeInstanceTypesInput{MaxResults: aws.Int32(100)}
	for _, t := range p.cfg.InstanceTypes {
		in.InstanceTypes = append(in.InstanceTypes, types.InstanceType(t))
	}
	if in.InstanceTypes != nil {
		in.MaxResults = nil // not allowed with explicit types
	}
	switch q.Kind {
	case "metal":
		in.Filters = append(in.Filters, types.Filter{Name: aws.String("bare-metal"), Values: []string{"true"}})
	case "vps":
		in.Filters = append(in.Filters, types.Filter{Name: aws.String("bare-metal"), Values: []string{"false"}})
	}
	var out []providers.Offer
	pages := ec2.NewDescribeInstanceTypesPaginator(p.api, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, callError("DescribeInstanceTypes", err)
		}
		for _, t := range page.InstanceTypes {
			out = append(out, p.offer(t))
		}
	}
	return out, nil
}

func (p *Provider) offer(t types.InstanceTypeInfo) providers.Offer {
	o := providers.Offer{ID: string(t.InstanceType), Kind: "vps", Region: p.cfg.Region}
	if aws.ToBool(t.BareMetal) {
		o.Kind = "metal"
	}
	if t.VCpuInfo != nil {
		o.VCPU = int64(aws.ToInt32(t.VCpuInfo.DefaultVCpus))
	}
	if t.MemoryInfo != nil {
		o.MemoryMiB = aws.ToInt64(t.MemoryInfo.SizeInMiB)
		o.MemoryGiB = o.MemoryMiB / 1024
	}
	if t.GpuInfo != nil {
		for _, g := range t.GpuInfo.Gpus {
			o.GPUs += int64(aws.ToInt32(g.Count))
			if o.GPUModel == "" {
				o.GPUModel = aws.ToString(g.Name)
			}
		}
	}
	return o
}

// Identify finds a running or pending instance the account launched.
func (p *Provider) Identify(ctx context.Context, id string) (providers.Machine, error) {
	if !strings.HasPrefix(id, "i-") {
		return providers.Machine{}, providers.ErrNoMachine
	}
	res, err := p.api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if apiCode(err) == "InvalidInstanceID.NotFound" || apiCode(err) == "InvalidInstanceID.Malformed" {
		return providers.Machine{}, providers.ErrNoMachine
	}
	if err != nil {
		return providers.Machine{}, callError("DescribeInstances", err)
	}
	for _, r := range res.Reservations {
		for _, i := range r.Instances {
			if aws.ToString(i.InstanceId) != id || !p.ours(i.Tags) {
				continue
			}
			state := ""
			if i.State != nil {
				state = string(i.State.Name)
			}
			if state == string(types.InstanceStateNameTerminated) || state == string(types.InstanceStateNameShuttingDown) {
				return providers.Machine{}, providers.ErrNoMachine
			}
			m := providers.Machine{ID: id, OfferID: string(i.InstanceType), State: state, Hostname: id}
			if i.CpuOptions != nil {
				m.VCPU = int64(aws.ToInt32(i.CpuOptions.CoreCount) * max(aws.ToInt32(i.CpuOptions.ThreadsPerCore), 1))
			}
			return m, nil
		}
	}
	return providers.Machine{}, providers.ErrNoMachine
}

func (p *Provider) ours(tags []types.Tag) bool {
	for _, t := range tags {
		if aws.ToString(t.Key) == AccountTag && aws.ToString(t.Value) == p.env.AccountID {
			return true
		}
	}
	return false
}

// Claim launches one instance of the offer, tagged with the account; the
// key is RunInstances' client token, so a retried claim gets the same
// instance.
func (p *Provider) Claim(ctx context.Context, offerID, key string) (providers.Machine, error) {
	if p.cfg.ImageID == "" {
		return providers.Machine{}, errors.New("ec2: the account's config names no imageId to launch")
	}
	in := &ec2.RunInstancesInput{
		ImageId: aws.String(p.cfg.ImageID), InstanceType: types.InstanceType(offerID), MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		ClientToken: aws.String(clientToken(key)), SecurityGroupIds: p.cfg.SecurityGroupIDs,
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance,
			Tags: []types.Tag{{Key: aws.String(AccountTag), Value: aws.String(p.env.AccountID)}}}},
	}
	if p.cfg.SubnetID != "" {
		in.SubnetId = aws.String(p.cfg.SubnetID)
	}
	res, err := p.api.RunInstances(ctx, in)
	if err != nil {
		return providers.Machine{}, callError("RunInstances", err)
	}
	if len(res.Instances) != 1 {
		return providers.Machine{}, fmt.Errorf("ec2: RunInstances answered %d instances", len(res.Instances))
	}
	i := res.Instances[0]
	m := providers.Machine{ID: aws.ToString(i.InstanceId), OfferID: offerID, Hostname: aws.ToString(i.InstanceId)}
	if i.State != nil {
		m.State = string(i.State.Name)
	}
	return m, nil
}

// clientToken is RunInstances' idempotency token: at most 64 ASCII
// characters.
func clientToken(key string) string {
	if len(key) > 64 {
		return key[len(key)-64:]
	}
	return key
}

// Release terminates an instance of the account.
func (p *Provider) Release(ctx context.Context, id string) error {
	if _, err := p.Identify(ctx, id); err != nil {
		return err
	}
	if _, err := p.api.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil {
		return callError("TerminateInstances", err)
	}
	return nil
}

// Install is not offered: see the package doc.
func (p *Provider) Install(context.Context, providers.Machine, providers.Install) error {
	return providers.ErrUnsupported
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// callError names the call and EC2's error code and message; a service
// error of the control plane (a reference that did not resolve) passes
// through as it is.
func callError(op string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return fmt.Errorf("ec2 %s: %s: %s", op, ae.ErrorCode(), ae.ErrorMessage())
	}
	return fmt.Errorf("ec2 %s: %w", op, err)
}
