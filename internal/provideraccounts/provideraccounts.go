// Package provideraccounts implements the providerAccounts group: a
// tenant's connections to the providers registered on the service
// (internal/providers), with configs checked by each provider's manifest
// and holding credentials only as references, offers asked of the provider
// live, and bootstraps that turn a provider's machine into a node of a
// pool (bootstrap.go, driven by the reconciler in job.go).
package provideraccounts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/buildinfo"
	"computeplane/internal/config"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/ids"
	"computeplane/internal/images"
	"computeplane/internal/keys"
	"computeplane/internal/pki"
	"computeplane/internal/providers"
	"computeplane/internal/release"
	"computeplane/internal/secrets"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// ResourceType is an account's type in the authorization projection.
const ResourceType = "provider-account"

// EnvPrefix is the prefix of the environment variables env:// references
// may name: a tenant must never read the service's own settings
// (SERVICE_SECRET ...) through a provider.
const EnvPrefix = "COMPUTE_PROVIDER_"

// DefaultProviderDir is where local providers keep machines when
// providerDir is not configured.
const DefaultProviderDir = ".service/providers"

var (
	createMethod    = api.Lookup("/providerAccounts/create")
	bootstrapMethod = api.Lookup("/providerAccounts/bootstrap")
)

// Service implements api.ProviderAccountsService.
type Service struct {
	reg       *providers.Registry
	secrets   *secrets.Service
	store     *store.Store
	images    images.Source
	dir       string
	bootstrap *config.Bootstrap
	baseURL   string
	// downloads is {baseURL}{basePath}/downloads/ when the deployment
	// serves downloads: bootstraps deliver the daemon from there.
	downloads string
	// cloudAttested: the deployment runs the cloud attestor, so installs
	// ask the daemon to present its machine's identity document.
	cloudAttested bool
	bundle        func() (*pki.Bundle, error)
	root          string
	log           *slog.Logger

	mu      sync.Mutex
	clients map[string]cached // account id -> client of its current version
}

type cached struct {
	version int64
	p       providers.Provider
}

var _ api.ProviderAccountsService = (*Service)(nil)

// New builds the service of a deployment: the providers it registers (the
// providers option among builtIn; every built-in one when empty), where
// local providers keep machines, and what bootstraps deliver.
func New(cfg *config.Config, st *store.Store, builtIn []*providers.Factory, imgs images.Source, bundle func() (*pki.Bundle, error), log *slog.Logger) (*Service, error) {
	reg, err := providers.NewRegistry(builtIn, cfg.Providers)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "providers: %s", err.Error())
	}
	dir := cfg.ProviderDir
	if dir == "" {
		dir = DefaultProviderDir
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{
		reg: reg, secrets: secrets.New(cfg.RootTenantID, string(cfg.Secrets.Store), keys.Derive(cfg.Secret, keys.Secrets)),
		store: st, images: imgs, dir: dir, bootstrap: cfg.Bootstrap, baseURL: cfg.BaseURL, bundle: bundle, root: cfg.RootTenantID, log: log,
		downloads: downloadsURL(cfg), clients: map[string]cached{}, cloudAttested: slices.Contains(cfg.Attestors, "cloud"),
	}, nil
}

// downloadsURL is where bootstraps download the daemon, "" when the
// deployment serves no downloads: the public base URL and the downloads
// route, at this control plane's own version when it is a release
// version, else the latest.
func downloadsURL(cfg *config.Config) string {
	if cfg.Downloads == nil {
		return ""
	}
	version := buildinfo.Version()
	if release.CheckVersion(version) != nil {
		version = release.Latest
	}
	return strings.TrimSuffix(cfg.BaseURL, "/") + cfg.BasePath + "/downloads/" + release.Path(agentName, version, "")
}

// agentName is the daemon's name in releases.
const agentName = "compute-agent"

func notFound(id string) error {
	return api.Errorf(api.CodeNotFound, "provider account %s not found", id)
}

func output(r db.ProviderAccount) (*api.ProviderAccount, error) {
	var cfg any
	if err := json.Unmarshal(r.Config, &cfg); err != nil {
		return nil, err
	}
	return &api.ProviderAccount{TenantID: r.TenantID, AccountID: r.AccountID, Provider: r.Provider, Name: r.Name, Config: cfg,
		Version: r.Version, CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt)}, nil
}

// checkConfig applies the reference rule and the manifest's schema, and
// refuses a secret:// reference the account could never resolve (another
// tenant's secret, or a fleet secret outside the root tenant).
func (s *Service) checkConfig(provider, tenant string, cfg any) error {
	issues := s.reg.Check(provider, cfg)
	for _, r := range providers.Refs(cfg) {
		if !strings.HasPrefix(r.Ref, "secret://") {
			continue
		}
		own := strings.HasPrefix(r.Ref, "secret://tenants/"+tenant+"/") || (tenant == s.root && strings.HasPrefix(r.Ref, "secret://fleet/"))
		if !own {
			issues = append(issues, providers.Issue{Path: r.Path, Message: fmt.Sprintf("%s is not a secret of tenant %s", r.Ref, tenant)})
		}
	}
	if len(issues) == 0 {
		return nil
	}
	return api.Errorf(api.CodeInvalidInput, "%s: %s", issues[0].Path, issues[0].Message).
		WithDetails(map[string]any{"issues": issues})
}

func (s *Service) known(provider string) error {
	if _, ok := s.reg.Get(provider); ok {
		return nil
	}
	known := s.reg.Known()
	return api.Errorf(api.CodeInvalidInput, "provider: %s is not registered on this service (known: %s)", provider, strings.Join(known, ", ")).
		WithDetails(map[string]any{"known": known})
}

// Create answers providerAccounts.create.
func (s *Service) Create(ctx context.Context, in *api.ProviderAccountsCreateInput) (*api.ProviderAccount, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.Key{Method: createMethod, ID: ids.New("pacct")}
	if in.IdempotencyKey != nil {
		// A retry (no second decision was made): the same request returns
		// the account, another is CONFLICT.
		k = idem.For(createMethod, in.TenantID, sess.Caller.IdentityID, *in.IdempotencyKey, in)
		existing, err := q.GetProviderAccount(ctx, k.ID)
		if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
			return nil, err
		} else if replay {
			return output(existing)
		}
	}
	if err := s.known(in.Provider); err != nil {
		return nil, err
	}
	cfg := in.Config
	if cfg == nil {
		cfg = map[string]any{}
	}
	if err := s.checkConfig(in.Provider, in.TenantID, cfg); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := q.ProviderAccountByName(ctx, db.ProviderAccountByNameParams{TenantID: in.TenantID, Name: in.Name}); err == nil {
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a provider account named %s", in.TenantID, in.Name)
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	row, err := q.InsertProviderAccount(ctx, db.InsertProviderAccountParams{AccountID: k.ID, TenantID: in.TenantID, Provider: in.Provider,
		Name: in.Name, Config: raw, CreatedBy: sess.Caller.IdentityID, IdemRequest: k.Fingerprint})
	if errors.Is(err, pgx.ErrNoRows) {
		// A concurrent create committed first: with the same key it is
		// this call's retry; else it took the name (a new k.ID is no one's).
		existing, err := q.GetProviderAccount(ctx, k.ID)
		if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
			return nil, err
		} else if replay {
			return output(existing)
		}
		return nil, api.Errorf(api.CodeConflict, "name: tenant %s has a provider account named %s", in.TenantID, in.Name)
	}
	if err != nil {
		return nil, err
	}
	attrs := map[string]string{"provider": row.Provider}
	if sess.Draft != nil {
		err = sess.MakeReal(ctx, tx, attrs)
	} else {
		err = sess.Projection().Put(ctx, tx, iam.Resource{Type: sess.TypePrefix() + ResourceType, ID: k.ID, TenantID: in.TenantID,
			Owner: sess.Caller.IdentityID, Attributes: attrs})
	}
	if err != nil {
		return nil, err
	}
	return output(row)
}

func load(ctx context.Context, q *db.Queries, tenant, id string, forUpdate bool) (db.ProviderAccount, error) {
	get := q.GetProviderAccount
	if forUpdate {
		get = q.GetProviderAccountForUpdate
	}
	r, err := get(ctx, id)
	return store.Visible(r, err, r.TenantID == tenant, notFound(id))
}

// Get answers providerAccounts.get.
func (s *Service) Get(ctx context.Context, in *api.ProviderAccountsGetInput) (*api.ProviderAccount, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.AccountID, false)
	if err != nil {
		return nil, err
	}
	return output(r)
}

// List answers providerAccounts.list: by name, unreadable ones left out.
func (s *Service) List(ctx context.Context, in *api.ProviderAccountsListInput) (*api.ProviderAccountList, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.ListProviderAccounts(ctx, in.TenantID)
	if err != nil {
		return nil, err
	}
	out := &api.ProviderAccountList{Items: []api.ProviderAccount{}}
	for _, r := range rows {
		if !sess.CanRead(ctx, "compute:providers:read", ResourceType, r.AccountID, r.TenantID) {
			continue
		}
		o, err := output(r)
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, *o)
	}
	return out, nil
}

// Update answers providerAccounts.update: the config replaced, the
// version raised; the next provider call builds a new client.
func (s *Service) Update(ctx context.Context, in *api.ProviderAccountsUpdateInput) (*api.ProviderAccount, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.AccountID, true)
	if err != nil {
		return nil, err
	}
	if err := s.checkConfig(r.Provider, r.TenantID, in.Config); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(in.Config)
	if err != nil {
		return nil, err
	}
	r, err = q.UpdateProviderAccountConfig(ctx, db.UpdateProviderAccountConfigParams{AccountID: r.AccountID, Config: raw})
	if err != nil {
		return nil, err
	}
	return output(r)
}

// Delete answers providerAccounts.delete: refused while a pool that is not
// archived, or an instance that is not deleted, uses the account.
func (s *Service) Delete(ctx context.Context, in *api.ProviderAccountsDeleteInput) (*api.ProviderAccountDeleted, error) {
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.AccountID, true)
	if err != nil {
		return nil, err
	}
	users, err := q.ProviderAccountUsers(ctx, pgtype.Text{String: r.AccountID, Valid: true})
	if err != nil {
		return nil, err
	}
	if users.Pools > 0 || users.Instances > 0 {
		return nil, api.Errorf(api.CodeInvalidState, "accountId: account %s is used by %d pools that are not archived and %d instances that are not deleted",
			r.AccountID, users.Pools, users.Instances).WithDetails(map[string]any{"pools": users.Pools, "instances": users.Instances})
	}
	if _, err := q.DeleteProviderAccount(ctx, r.AccountID); err != nil {
		return nil, err
	}
	if err := sess.Projection().Delete(ctx, tx, iam.Ref{Type: sess.TypePrefix() + ResourceType, ID: r.AccountID}); err != nil {
		return nil, err
	}
	s.forget(r.AccountID)
	return &api.ProviderAccountDeleted{Deleted: true}, nil
}

// Offers answers providerAccounts.offers: asked of the provider now, then
// narrowed by the query.
func (s *Service) Offers(ctx context.Context, in *api.ProviderAccountsOffersInput) (*api.OfferList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := load(ctx, q, in.TenantID, in.AccountID, false)
	if err != nil {
		return nil, err
	}
	f, ok := s.reg.Get(r.Provider)
	if !ok {
		return nil, api.Errorf(api.CodeInvalidConfig, "provider %s of account %s is no longer registered on this service", r.Provider, r.AccountID)
	}
	if !f.Manifest.Can(providers.CapOffers) {
		return nil, api.Errorf(api.CodeUnsupported, "provider %s lists no offers", r.Provider)
	}
	query := providers.Query{}
	if qq := in.Query; qq != nil {
		query = providers.Query{Kind: deref(qq.Kind), Region: deref(qq.Region), GPUModel: deref(qq.GPUModel),
			MinGPUs: derefInt(qq.MinGpus), MinVCPU: derefInt(qq.MinVcpu), MinGiB: derefInt(qq.MinMemoryGiB)}
	}
	p, err := s.client(r)
	if err != nil {
		return nil, providerError(r, err)
	}
	offers, err := p.Offers(ctx, query)
	if err != nil {
		return nil, providerError(r, err)
	}
	out := &api.OfferList{Items: []map[string]any{}}
	for _, o := range offers {
		if !query.Match(o) {
			continue
		}
		b, _ := json.Marshal(o)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		out.Items = append(out.Items, m)
	}
	return out, nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// providerError says a provider call failed; a service error (a secret
// that does not resolve, an unsupported call) keeps its code.
func providerError(r db.ProviderAccount, err error) error {
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, providers.ErrUnsupported):
		return api.Errorf(api.CodeUnsupported, "provider %s: %s", r.Provider, err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return err
	}
	return api.Errorf(api.CodeProviderError, "provider %s of account %s: %s", r.Provider, r.AccountID, err.Error())
}

// client returns the provider client of an account's current version,
// building a new one (and closing the old) when its config changed.
func (s *Service) client(r db.ProviderAccount) (providers.Provider, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[r.AccountID]; ok {
		if c.version == r.Version {
			return c.p, nil
		}
		c.p.Close()
		delete(s.clients, r.AccountID)
	}
	f, ok := s.reg.Get(r.Provider)
	if !ok {
		return nil, api.Errorf(api.CodeInvalidConfig, "provider %s of account %s is no longer registered on this service", r.Provider, r.AccountID)
	}
	env := providers.Env{
		Dir: filepath.Join(s.dir, r.Provider), TenantID: r.TenantID, AccountID: r.AccountID, Log: s.log.With("provider", r.Provider, "accountId", r.AccountID),
		Resolve: func(ctx context.Context, ref string) (string, error) { return s.resolve(ctx, r.TenantID, ref) },
		Images:  s.imageResolver(),
	}
	p, err := f.New(env, r.Config)
	if err != nil {
		return nil, err
	}
	s.clients[r.AccountID] = cached{version: r.Version, p: p}
	return p, nil
}

// Clients counts the provider clients built so far (tests).
func (s *Service) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients)
}

func (s *Service) forget(account string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[account]; ok {
		c.p.Close()
		delete(s.clients, account)
	}
}

// Close ends every provider client.
func (s *Service) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range s.clients {
		c.p.Close()
		delete(s.clients, id)
	}
}

// resolve returns the value of a reference for a provider of tenant's
// account, at call time. secret:// resolves the tenant's own secrets;
// env:// only variables named COMPUTE_PROVIDER_*; vault:// needs a vault,
// which this build has not.
func (s *Service) resolve(ctx context.Context, tenant, ref string) (string, error) {
	if msg := providers.CheckReference(ref); msg != "" {
		return "", api.Errorf(api.CodeInvalidInput, "%s: %s", ref, msg)
	}
	switch {
	case strings.HasPrefix(ref, "secret://"):
		v, _, err := s.secrets.Resolve(ctx, db.New(s.store.Pool()), tenant, ref)
		if err != nil {
			return "", err
		}
		return string(v), nil
	case strings.HasPrefix(ref, "env://"):
		name := strings.TrimPrefix(ref, "env://")
		if !strings.HasPrefix(name, EnvPrefix) {
			return "", api.Errorf(api.CodeInvalidInput, "%s: env:// references name variables starting %s only", ref, EnvPrefix)
		}
		v, ok := os.LookupEnv(name)
		if !ok {
			return "", api.Errorf(api.CodeInvalidConfig, "%s: the variable is not set on this service", ref)
		}
		return v, nil
	}
	return "", api.Errorf(api.CodeInvalidConfig, "%s: this service has no vault configured", ref)
}

func (s *Service) imageResolver() providers.ImageResolver {
	if s.images == nil {
		return nil
	}
	return func(ctx context.Context, id string) (string, string, string, error) {
		im, err := s.images.Get(ctx, id)
		if errors.Is(err, images.ErrNotFound) {
			return "", "", "", fmt.Errorf("image %s not found", id)
		}
		if err != nil {
			return "", "", "", err
		}
		if im.Format != "kernel+initrd" {
			return "", "", "", fmt.Errorf("image %s is %s, not kernel+initrd", id, im.Format)
		}
		return im.Location, im.Initrd, im.Cmdline, nil
	}
}

func text(p *string) pgtype.Text {
	if p == nil {
		return pgtype.Text{}
	}
	return pgtype.Text{String: *p, Valid: true}
}
