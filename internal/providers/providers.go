// Package providers owns the contract between the control plane and the
// external machine providers a tenant connects through providerAccounts:
// a provider's manifest (its name, the JSON Schema of an account's config
// and its capabilities), the registry of the providers compiled into this
// binary, the config checks every account passes (the manifest's schema,
// and secret-like fields held only as secret://, vault:// or env://
// references), and the resolution of those references when a provider is
// called. Adapters live in internal/providers/<name>.
package providers

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Capability is one thing a provider can do.
type Capability string

// Capabilities of the specification.
const (
	CapOffers    Capability = "offers"    // list machine types
	CapIdentify  Capability = "identify"  // find an existing machine by id
	CapClaim     Capability = "claim"     // get a new machine of an offer
	CapRelease   Capability = "release"   // give a machine back
	CapBootstrap Capability = "bootstrap" // install the node daemon on a machine
	// CapInstances (ours, beyond the specification's list): launch a
	// machine running a tenant's image and user data (Launcher), so that
	// instances of provider pools run on the provider's machines.
	CapInstances Capability = "instances"
)

// Manifest describes a provider.
type Manifest struct {
	Name        string
	Description string
	// ConfigSchema is the JSON Schema (draft 2020-12) of an account's
	// config.
	ConfigSchema string
	Capabilities []Capability
}

// Can reports whether the manifest declares c.
func (m *Manifest) Can(c Capability) bool { return slices.Contains(m.Capabilities, c) }

// CanBootstrap reports whether machines of the provider can become nodes:
// it must identify or claim them and install the daemon.
func (m *Manifest) CanBootstrap() bool {
	return m.Can(CapBootstrap) && (m.Can(CapIdentify) || m.Can(CapClaim))
}

// Offer is one machine type a provider offers.
type Offer struct {
	ID          string `json:"offerId"`
	Kind        string `json:"kind"` // metal or vps
	Region      string `json:"region"`
	VCPU        int64  `json:"vcpu"`
	MemoryGiB   int64  `json:"memoryGiB"`
	MemoryMiB   int64  `json:"memoryMiB"`
	GPUModel    string `json:"gpuModel,omitempty"`
	GPUs        int64  `json:"gpus"`
	Description string `json:"description,omitempty"`
}

// Query narrows offers (providerAccounts.offers query); zero values do
// not narrow.
type Query struct {
	Kind, Region, GPUModel   string
	MinGPUs, MinVCPU, MinGiB int64
}

// Match reports whether o passes q. Providers may filter on their side
// too; the service applies Match to whatever comes back.
func (q Query) Match(o Offer) bool {
	switch {
	case q.Kind != "" && o.Kind != q.Kind,
		q.Region != "" && o.Region != q.Region,
		q.GPUModel != "" && !strings.EqualFold(o.GPUModel, q.GPUModel),
		o.GPUs < q.MinGPUs, o.VCPU < q.MinVCPU, o.MemoryMiB < q.MinGiB*1024:
		return false
	}
	return true
}

// Machine is one machine of an account.
type Machine struct {
	ID      string
	OfferID string
	// State is the provider's word for it (running, stopped, gone).
	State string
	// Hostname is the name the machine joins with.
	Hostname  string
	VCPU      int64
	MemoryMiB int64
}

// Install is what bootstrap hands a provider to put the node daemon on a
// machine. Token is a single-use join token bound to the machine: the
// provider passes it to the daemon and keeps it nowhere.
type Install struct {
	JoinURL string // where the daemon joins (the public host)
	Token   string
	// Agent is the daemon's binary on this host, when the deployment
	// serves no downloads.
	Agent string
	// AgentURL, when the deployment serves downloads, is where the
	// daemon is downloaded instead: {basePath}/downloads/compute-agent/
	// <version>/, to which the provider appends its machine's
	// <os>-<arch>. The provider verifies what it downloads with
	// release.Get and Download.Install against ReleaseKeys before it runs
	// it.
	AgentURL    string
	ReleaseKeys []ed25519.PublicKey
	PoolID      string
	// CloudAttested is set when the control plane runs the cloud
	// instance-identity attestor (attestors: [cloud]): the daemon's join
	// must carry the machine's signed identity document from the
	// provider's metadata service.
	CloudAttested bool
}

// ErrNoMachine answers identify, release or install of a machine the
// account does not have.
var ErrNoMachine = errors.New("providers: no such machine on this account")

// ErrUnsupported answers a call of a capability the provider lacks.
var ErrUnsupported = errors.New("providers: the provider cannot do this")

// Provider is a client of one account of a provider, built from its
// config. Methods of capabilities it lacks answer ErrUnsupported.
type Provider interface {
	Offers(ctx context.Context, q Query) ([]Offer, error)
	Identify(ctx context.Context, machineID string) (Machine, error)
	Claim(ctx context.Context, offerID, key string) (Machine, error)
	Release(ctx context.Context, machineID string) error
	// Install delivers the daemon to a machine with the install's join
	// token; it returns once the daemon was started (joining is seen by
	// the control plane, not by the provider).
	Install(ctx context.Context, m Machine, in Install) error
	// Close ends the client (an update replaced its config).
	Close()
}

// Launch is what an instance of a provider pool asks of its machine: the
// tenant's image, a hostname, and user data (secret references already
// resolved: the provider is the host here; it must not keep it).
type Launch struct {
	ImageID  string
	Hostname string
	UserData string
}

// Launcher is a provider whose machines can run instances of provider
// pools: Launch gets a machine of an offer running the launch's image
// and user data, and returns once it runs. The key makes a retried launch
// (after a crash) find the machine it made. Release ends it.
type Launcher interface {
	Launch(ctx context.Context, offerID, key string, l Launch) (Machine, error)
}

// Env is what the deployment gives a provider's client.
type Env struct {
	// Dir is where a provider that runs machines on this host keeps them
	// (its own directory under the deployment's providerDir).
	Dir       string
	TenantID  string
	AccountID string
	Log       *slog.Logger
	// Resolve returns the value of a secret://, vault:// or env://
	// reference, at call time; never store what it returns.
	Resolve func(ctx context.Context, ref string) (string, error)
	// Images resolves an image id to its kernel and initrd paths (local
	// providers); nil without an image source.
	Images ImageResolver
}

// ImageResolver finds a kernel+initrd image on this host.
type ImageResolver func(ctx context.Context, id string) (kernel, initrd, cmdline string, err error)

// Factory makes providers of one kind.
type Factory struct {
	Manifest Manifest
	// New builds a client for one account from its stored config (secret
	// references unresolved).
	New func(env Env, config json.RawMessage) (Provider, error)
}

// Registry holds the providers a deployment registered.
type Registry struct {
	factories map[string]*Factory
	schemas   map[string]*schema
}

// NewRegistry registers the named providers among those built into this
// binary (the list its main passes, internal/builtin); none named
// registers every one built in. A name that is not built in is an error,
// and so is a built-in provider whose manifest does not compile.
func NewRegistry(builtIn []*Factory, names []string) (*Registry, error) {
	byName := make(map[string]*Factory, len(builtIn))
	for _, f := range builtIn {
		if _, ok := byName[f.Manifest.Name]; ok {
			return nil, fmt.Errorf("provider %q is built in twice", f.Manifest.Name)
		}
		byName[f.Manifest.Name] = f
	}
	if len(names) == 0 {
		for n := range byName {
			names = append(names, n)
		}
	}
	r := &Registry{factories: map[string]*Factory{}, schemas: map[string]*schema{}}
	for _, n := range names {
		f, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("provider %q is not built into this binary (built in: %s)", n, strings.Join(slices.Sorted(maps.Keys(byName)), ", "))
		}
		s, err := compile(f.Manifest)
		if err != nil {
			return nil, fmt.Errorf("provider %s: %w", n, err)
		}
		r.factories[n], r.schemas[n] = f, s
	}
	return r, nil
}

// Known lists the registered providers, sorted.
func (r *Registry) Known() []string {
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Get returns a registered provider's factory.
func (r *Registry) Get(name string) (*Factory, bool) {
	f, ok := r.factories[name]
	return f, ok
}

// Check validates an account's config for the named registered provider
// and returns every issue (paths start at "config").
func (r *Registry) Check(name string, config any) []Issue {
	s, ok := r.schemas[name]
	if !ok {
		return []Issue{{Path: "provider", Message: "is not registered"}}
	}
	return CheckConfig(s, config)
}
