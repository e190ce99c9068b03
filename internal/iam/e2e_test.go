package iam_test

// End-to-end tests of identity on the envelope: the real api role (host
// wiring: iam.Gate over iam.NewCached(embedded.New(...)), audit.Record) on a
// fresh PostgreSQL, called through the generated client over HTTP with API
// keys minted as computed iam create-key mints them.
//
// The authorization matrix is driven by a table of valid inputs per method
// (matrix, keyed by the method's full name): every registered non-public
// method of api.Methods must have a row (TestMatrixCoversEveryRegisteredMethod
// fails otherwise), so a method joins the matrix when it is registered.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/host"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/testenv"
)

// ---------------------------------------------------------------------------
// The matrix table.

// matrixCase is one valid input of a registered non-public method, and who
// is admitted with it.
type matrixCase struct {
	name string
	// call invokes the method through the generated client with valid input
	// naming tenant ("" for methods without tenantId). Each call must be
	// valid on its own: a create makes up a fresh idempotency key, a change
	// takes an object from fx.
	call func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error)
	// rootInput names the root tenant in the input (objects that belong to
	// the root tenant); otherwise tenant-scoped methods are called on acme
	// and on globex.
	rootInput bool
	// tenantRoles are the roles of the input's tenant that are admitted (for
	// methods without tenantId: the roles of any non-root tenant admitted).
	tenantRoles []string
	// rootRoles are the roles of the root tenant that are admitted, in any
	// tenant (the fleet operators).
	rootRoles []string
	// ok checks the answer of an admitted call made on tenant.
	ok func(t *testing.T, res any, tenant string)
}

var (
	owner  = embedded.RoleOwner
	admin  = embedded.RoleAdmin
	member = embedded.RoleMember
	viewer = embedded.RoleViewer
)

// matrix holds the cases of every registered non-public method, by full
// name. A method joins it when it is registered.
var matrix = map[string][]matrixCase{
	api.MethodSystemSelfCheck: {{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, _ string) (any, error) {
			return c.SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
		},
		rootRoles: []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			r := res.(*client.SystemSelfCheckResult)
			assert.True(t, r.Data.Ok, "findings: %+v", r.Data.Findings)
			checks := map[string]bool{}
			for _, f := range r.Data.Findings {
				checks[f.Check] = true
			}
			for _, name := range []string{"catalog", "migrations", "btree_gist", "clock"} {
				assert.True(t, checks[name], "finding of %s", name)
			}
		},
	}},
	"sites.list": {{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.SitesList(t.Context(), &client.SitesListInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member, viewer},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			for _, s := range res.(*client.SitesListResult).Data.Items {
				assert.Equal(t, tenant, s.TenantId)
			}
		},
	}},
	"events.list": {{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.EventsList(t.Context(), &client.EventsListInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member, viewer},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			for _, e := range res.(*client.EventsListResult).Data.Items {
				assert.Equal(t, tenant, e.Tenantid)
			}
		},
	}},
	"sites.get": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SitesGet(t.Context(), &client.SitesGetInput{TenantId: tenant, SiteId: fx.site(t, tenant)})
		},
		tenantRoles: []string{owner, admin, member, viewer},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			assert.Equal(t, tenant, res.(*client.SitesGetResult).Data.TenantId)
		},
	}},
	"sites.create": {{
		name: "custom",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SitesCreate(t.Context(), &client.SitesCreateInput{
				TenantId: tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: fx.unique(),
			})
		},
		tenantRoles: []string{owner, admin, member}, // members create (docs/identity.md, row 6)
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			s := res.(*client.SitesCreateResult).Data
			assert.Equal(t, tenant, s.TenantId)
			assert.Equal(t, "custom", string(s.Kind))
		},
	}, {
		name: "shared",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SitesCreate(t.Context(), &client.SitesCreateInput{
				TenantId: tenant, Kind: client.SitesCreateInputKindShared, Region: "eu-west", IdempotencyKey: fx.unique(),
			})
		},
		rootInput: true,
		rootRoles: []string{owner, admin}, // decided on fleet/global
		ok: func(t *testing.T, res any, tenant string) {
			s := res.(*client.SitesCreateResult).Data
			assert.Equal(t, tenant, s.TenantId)
			assert.Equal(t, "shared", string(s.Kind))
		},
	}},
	"sites.update": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SitesUpdate(t.Context(), &client.SitesUpdateInput{
				TenantId: tenant, SiteId: fx.site(t, tenant), Region: client.NewOptString("eu-central"),
			})
		},
		tenantRoles: []string{owner, admin}, // the site's creator is another identity (its tenant's owner key)
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			s := res.(*client.SitesUpdateResult).Data
			assert.Equal(t, "eu-central", s.Region)
		},
	}},
	"sites.delete": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SitesDelete(t.Context(), &client.SitesDeleteInput{TenantId: tenant, SiteId: fx.site(t, tenant)})
		},
		tenantRoles: []string{owner, admin},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.SitesDeleteResult).Data.Deleted)
		},
	}},
	// Secrets are not projected: both methods are decided on the tenant
	// (members create in their tenant, docs/identity.md row 6) or, for scope
	// fleet, on fleet/global.
	"secrets.put": {{
		name: "tenant",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SecretsPut(t.Context(), &client.SecretsPutInput{
				TenantId: tenant, Name: fx.unique(), Value: "s3cr3t-value", IdempotencyKey: fx.unique(),
			})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			v := res.(*client.SecretsPutResult).Data
			assert.True(t, strings.HasPrefix(v.Reference, "secret://tenants/"+tenant+"/"), v.Reference)
			assert.Positive(t, v.Version)
		},
	}, {
		name: "fleet",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SecretsPut(t.Context(), &client.SecretsPutInput{
				TenantId: tenant, Name: fx.unique(), Value: "s3cr3t-value", IdempotencyKey: fx.unique(),
				Scope: client.NewOptSecretsPutInputScope(client.SecretsPutInputScopeFleet),
			})
		},
		rootInput: true,
		rootRoles: []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			v := res.(*client.SecretsPutResult).Data
			assert.True(t, strings.HasPrefix(v.Reference, "secret://fleet/"), v.Reference)
		},
	}},
	"secrets.delete": {{
		name: "tenant",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SecretsDelete(t.Context(), &client.SecretsDeleteInput{TenantId: tenant, Name: fx.secret(t, tenant, false)})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.SecretsDeleteResult).Data.Deleted)
		},
	}, {
		name: "fleet",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SecretsDelete(t.Context(), &client.SecretsDeleteInput{
				TenantId: tenant, Name: fx.secret(t, tenant, true),
				Scope: client.NewOptSecretsDeleteInputScope(client.SecretsDeleteInputScopeFleet),
			})
		},
		rootInput: true,
		rootRoles: []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.SecretsDeleteResult).Data.Deleted)
		},
	}},
	// secrets.list is decided like put and delete (the specification gives
	// secrets only compute:secrets:manage): members and above list names
	// and versions, viewers do not.
	"secrets.list": {{
		name: "tenant",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SecretsList(t.Context(), &client.SecretsListInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			for _, it := range res.(*client.SecretsListResult).Data.Items {
				assert.True(t, strings.HasPrefix(it.Reference, "secret://tenants/"+tenant+"/"), it.Reference)
			}
		},
	}, {
		name: "fleet",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.SecretsList(t.Context(), &client.SecretsListInput{
				TenantId: tenant, Scope: client.NewOptSecretsListInputScope(client.SecretsListInputScopeFleet),
			})
		},
		rootInput: true,
		rootRoles: []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			for _, it := range res.(*client.SecretsListResult).Data.Items {
				assert.True(t, strings.HasPrefix(it.Reference, "secret://fleet/"), it.Reference)
			}
		},
	}},
	// Webhooks are not projected: every method is decided with
	// compute:webhooks:manage on the tenant, which members of the tenant
	// may do (docs/identity.md row 6) and viewers may not, reads included.
	// Per tenant the matrix makes at most 5 webhooks per create case (3
	// tenant roles, 2 root roles), the fixture webhook and one spare for
	// delete: 12 of the 20 a tenant may hold.
	"webhooks.create": {{
		name: "types",
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{
				TenantId: tenant, URL: matrixHookURL, Events: []string{"site.created", "site.*"},
				Description: client.NewOptString("matrix"),
			})
		},
		tenantRoles: []string{owner, admin, member}, // manage on the tenant: members too (row 6)
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.WebhooksCreateResult).Data
			w := d.Webhook
			assert.Equal(t, tenant, w.TenantId)
			assert.True(t, strings.HasPrefix(w.WebhookId, "whk_"), w.WebhookId)
			assert.Equal(t, matrixHookURL, w.URL)
			assert.Equal(t, []string{"site.created", "site.*"}, w.Events)
			assert.Equal(t, "matrix", w.Description)
			assert.True(t, w.Active)
			assert.EqualValues(t, 1, w.Version)
			assert.True(t, w.PreviousSecretExpiresAt.Null, "no rotation overlap")
			assert.True(t, strings.HasPrefix(d.Secret, "whsec_"), "the secret is shown once, on create")
		},
	}, {
		name: "wildcard",
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{
				TenantId: tenant, URL: matrixHookURL + "/all", Events: []string{"*"},
			})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.WebhooksCreateResult).Data
			assert.Equal(t, tenant, d.Webhook.TenantId)
			assert.Equal(t, []string{"*"}, d.Webhook.Events)
			assert.Empty(t, d.Webhook.Description, "empty when none was given")
			assert.True(t, strings.HasPrefix(d.Secret, "whsec_"))
		},
	}},
	"webhooks.list": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			fx.webhook(t, tenant) // never an empty list
			return c.WebhooksList(t.Context(), &client.WebhooksListInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member}, // a read decided with manage: no viewer
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			items := res.(*client.WebhooksListResult).Data.Items
			require.NotEmpty(t, items)
			for i, w := range items {
				assert.Equal(t, tenant, w.TenantId)
				if i > 0 {
					assert.False(t, w.CreatedAt.Before(items[i-1].CreatedAt), "oldest first")
				}
			}
		},
	}},
	"webhooks.get": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.WebhooksGet(t.Context(), &client.WebhooksGetInput{TenantId: tenant, WebhookId: fx.webhook(t, tenant)})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			w := res.(*client.WebhooksGetResult).Data
			assert.Equal(t, tenant, w.TenantId)
			assert.True(t, strings.HasPrefix(w.URL, matrixHookURL), w.URL)
			assert.True(t, w.Active)
		},
	}},
	"webhooks.update": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			// A description never stored before, so every call is a change.
			return c.WebhooksUpdate(t.Context(), &client.WebhooksUpdateInput{
				TenantId: tenant, WebhookId: fx.webhook(t, tenant), Description: client.NewOptString(fx.unique()),
				Events: []string{"site.*", "webhook.ping"},
			})
		},
		tenantRoles: []string{owner, admin, member}, // the webhook's creator is its tenant's owner: not projected, decided on the tenant
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			w := res.(*client.WebhooksUpdateResult).Data
			assert.Equal(t, tenant, w.TenantId)
			assert.True(t, strings.HasPrefix(w.Description, "matrix-"), w.Description)
			assert.Equal(t, []string{"site.*", "webhook.ping"}, w.Events)
			assert.Greater(t, w.Version, int64(1), "an update raises version")
			assert.True(t, w.Active, "an update naming no active keeps it")
		},
	}},
	"webhooks.rotateSecret": {{
		name: "overlap",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.WebhooksRotateSecret(t.Context(), &client.WebhooksRotateSecretInput{
				TenantId: tenant, WebhookId: fx.webhook(t, tenant), KeepPreviousSeconds: client.NewOptInt64(3600),
			})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.WebhooksRotateSecretResult).Data
			assert.Equal(t, tenant, d.Webhook.TenantId)
			assert.True(t, strings.HasPrefix(d.Secret, "whsec_"), "the new secret is shown once")
			assert.Greater(t, d.Webhook.Version, int64(1), "a rotation raises version")
			until, ok := d.Webhook.PreviousSecretExpiresAt.Get()
			if assert.True(t, ok, "the previous secret keeps signing") {
				assert.True(t, until.After(time.Now()), until)
			}
		},
	}, {
		name: "immediate",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.WebhooksRotateSecret(t.Context(), &client.WebhooksRotateSecretInput{
				TenantId: tenant, WebhookId: fx.webhook(t, tenant),
			})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, tenant string) {
			d := res.(*client.WebhooksRotateSecretResult).Data
			assert.Equal(t, tenant, d.Webhook.TenantId)
			assert.True(t, strings.HasPrefix(d.Secret, "whsec_"))
			assert.True(t, d.Webhook.PreviousSecretExpiresAt.Null, "keepPreviousSeconds 0 stops the previous secret at once")
		},
	}},
	"webhooks.delete": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			id := fx.spareWebhook(t, tenant)
			res, err := c.WebhooksDelete(t.Context(), &client.WebhooksDeleteInput{TenantId: tenant, WebhookId: id})
			if err == nil {
				fx.used("spare-webhook", tenant, id)
			}
			return res, err
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			assert.True(t, res.(*client.WebhooksDeleteResult).Data.Deleted)
		},
	}},
	"webhooks.ping": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			return c.WebhooksPing(t.Context(), &client.WebhooksPingInput{TenantId: tenant, WebhookId: fx.webhook(t, tenant)})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			d := res.(*client.WebhooksPingResult).Data
			assert.True(t, strings.HasPrefix(d.DeliveryId, "dlv_"), d.DeliveryId)
			assert.Equal(t, "webhook.ping", d.EventType)
			assert.Equal(t, client.DeliveryStatePending, d.State, "a ping is a pending delivery")
			assert.Zero(t, d.Attempts)
			assert.True(t, !d.NextAttemptAt.Null, "a pending delivery is due")
			assert.True(t, d.LastAttemptAt.Null)
		},
	}},
	"webhooks.deliveries": {{
		name: "all",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			fx.delivery(t, tenant) // never an empty history
			return c.WebhooksDeliveries(t.Context(), &client.WebhooksDeliveriesInput{TenantId: tenant, WebhookId: fx.webhook(t, tenant)})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			items := res.(*client.WebhooksDeliveriesResult).Data.Items
			require.NotEmpty(t, items)
			for i, d := range items {
				assert.Equal(t, items[0].WebhookId, d.WebhookId, "one webhook's deliveries")
				if i > 0 {
					assert.False(t, d.CreatedAt.After(items[i-1].CreatedAt), "newest first")
				}
			}
		},
	}, {
		name: "dead",
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			fx.delivery(t, tenant) // a dead one to list
			return c.WebhooksDeliveries(t.Context(), &client.WebhooksDeliveriesInput{
				TenantId: tenant, WebhookId: fx.webhook(t, tenant), Limit: client.NewOptInt64(5),
				State: client.NewOptWebhooksDeliveriesInputState(client.WebhooksDeliveriesInputStateDead),
			})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			items := res.(*client.WebhooksDeliveriesResult).Data.Items
			require.NotEmpty(t, items)
			assert.LessOrEqual(t, len(items), 5)
			for _, d := range items {
				assert.Equal(t, client.DeliveryStateDead, d.State)
			}
		},
	}},
	"webhooks.redeliver": {{
		call: func(t *testing.T, c *computeclient.Client, fx *fixture, tenant string) (any, error) {
			id := fx.delivery(t, tenant)
			res, err := c.WebhooksRedeliver(t.Context(), &client.WebhooksRedeliverInput{TenantId: tenant, DeliveryId: id})
			if err == nil {
				fx.used("dead-delivery", tenant, id) // pending again: a second redeliver would be INVALID_STATE
			}
			return res, err
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			d := res.(*client.WebhooksRedeliverResult).Data
			assert.True(t, strings.HasPrefix(d.DeliveryId, "dlv_"), d.DeliveryId)
			assert.Equal(t, client.DeliveryStatePending, d.State, "dead becomes pending")
			assert.Zero(t, d.Attempts, "attempts reset")
			assert.True(t, !d.NextAttemptAt.Null, "due now")
			assert.True(t, d.LastStatus.Null, "last status cleared")
			assert.True(t, d.LastAttemptAt.Null)
		},
	}},
	"webhooks.eventTypes": {{
		call: func(t *testing.T, c *computeclient.Client, _ *fixture, tenant string) (any, error) {
			return c.WebhooksEventTypes(t.Context(), &client.WebhooksEventTypesInput{TenantId: tenant})
		},
		tenantRoles: []string{owner, admin, member},
		rootRoles:   []string{owner, admin},
		ok: func(t *testing.T, res any, _ string) {
			items := res.(*client.WebhooksEventTypesResult).Data.Items
			require.NotEmpty(t, items)
			types := map[string]string{}
			for _, e := range items {
				assert.NotEmpty(t, e.Type)
				assert.NotEmpty(t, e.Module, e.Type)
				types[e.Type] = e.Module
			}
			assert.Contains(t, types, "site.created")
			assert.Equal(t, "webhooks", types["webhook.ping"])
		},
	}},
}

// fixture gives matrix cases what their input names: fresh idempotency
// keys, and sites made by an owner of the tenant (a fresh one per call, or
// the one prepared per tenant when prepare was called); webhooks and
// deliveries made by an owner of the tenant, kept per tenant (see webhook).
type fixture struct {
	env      *testenv.Env
	owners   map[string]string // tenant -> an owner's key
	prepared map[string]string // kind/tenant -> object
	n        atomic.Int64

	mu   sync.Mutex
	kept map[string]string // kind/tenant -> object made on first use, until used up
}

// matrixHookURL is the URL of the matrix's webhooks: public https, a DNS
// name accepted without being resolved; nothing is delivered (the api role
// of testenv runs no worker).
const matrixHookURL = "https://hooks.example.com/matrix"

func newFixture(env *testenv.Env, keys []keyOf) *fixture {
	fx := &fixture{env: env, owners: map[string]string{}, kept: map[string]string{}}
	for _, k := range keys {
		if k.role == owner {
			fx.owners[k.tenant] = k.token
		}
	}
	return fx
}

func (fx *fixture) unique() string {
	return fmt.Sprintf("matrix-%d-%d", time.Now().UnixNano(), fx.n.Add(1))
}

func (fx *fixture) site(t *testing.T, tenant string) string {
	t.Helper()
	if id, ok := fx.prepared["site/"+tenant]; ok {
		return id
	}
	res, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: fx.unique(),
	})
	require.NoError(t, err, "fixture: a site in %s", tenant)
	return res.Data.SiteId
}

// secret returns the name of a secret of tenant (scope fleet when fleet),
// put by an owner of the tenant.
func (fx *fixture) secret(t *testing.T, tenant string, fleet bool) string {
	t.Helper()
	kind := "secret/"
	in := &client.SecretsPutInput{TenantId: tenant, Name: fx.unique(), Value: "fixture-value", IdempotencyKey: fx.unique()}
	if fleet {
		kind = "fleet-secret/"
		in.Scope = client.NewOptSecretsPutInputScope(client.SecretsPutInputScopeFleet)
	}
	if name, ok := fx.prepared[kind+tenant]; ok {
		return name
	}
	_, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).SecretsPut(t.Context(), in)
	require.NoError(t, err, "fixture: a secret in %s", tenant)
	return in.Name
}

// keep returns the object of kind kept for tenant, a new one when there
// is none (or the last was used up): made by mk.
func (fx *fixture) keep(kind, tenant string, mk func() string) string {
	key := kind + "/" + tenant
	fx.mu.Lock()
	id, ok := fx.kept[key]
	fx.mu.Unlock()
	if ok {
		return id
	}
	id = mk()
	fx.mu.Lock()
	defer fx.mu.Unlock()
	fx.kept[key] = id
	return id
}

// used forgets the object of kind kept for tenant once a call used it up
// (deleted it, made it pending): the next call is given a new one.
func (fx *fixture) used(kind, tenant, id string) {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	if fx.kept[kind+"/"+tenant] == id {
		delete(fx.kept, kind+"/"+tenant)
	}
}

// newWebhook creates a webhook of tenant as an owner of the tenant.
func (fx *fixture) newWebhook(t *testing.T, tenant, description string) string {
	t.Helper()
	res, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).WebhooksCreate(t.Context(), &client.WebhooksCreateInput{
		TenantId: tenant, URL: matrixHookURL, Events: []string{"site.created"}, Description: client.NewOptString(description),
	})
	require.NoError(t, err, "fixture: a webhook in %s", tenant)
	return res.Data.Webhook.WebhookId
}

// webhook returns the webhook of tenant every call that reads or changes
// one names (made once per tenant by an owner of it): the webhooks a
// matrix makes stay well under the 20 a tenant may hold.
func (fx *fixture) webhook(t *testing.T, tenant string) string {
	t.Helper()
	return fx.keep("webhook", tenant, func() string { return fx.newWebhook(t, tenant, "fixture") })
}

// spareWebhook returns a webhook of tenant for webhooks.delete to delete:
// a fresh one after each delete, the same one while calls are refused
// (delete marks it used).
func (fx *fixture) spareWebhook(t *testing.T, tenant string) string {
	t.Helper()
	return fx.keep("spare-webhook", tenant, func() string { return fx.newWebhook(t, tenant, "fixture to delete") })
}

// delivery returns a dead delivery of tenant for webhooks.redeliver: a ping
// of the tenant's webhook, made dead in the table (a pending delivery is
// INVALID_STATE); a fresh one after each redeliver, the same one while calls
// are refused (redeliver marks it used).
func (fx *fixture) delivery(t *testing.T, tenant string) string {
	t.Helper()
	return fx.keep("dead-delivery", tenant, func() string {
		res, err := fx.env.Client(t, computeclient.WithToken(fx.owners[tenant])).WebhooksPing(t.Context(), &client.WebhooksPingInput{
			TenantId: tenant, WebhookId: fx.webhook(t, tenant),
		})
		require.NoError(t, err, "fixture: a ping in %s", tenant)
		id := res.Data.DeliveryId
		tag, err := fx.env.Store.Pool().Exec(t.Context(), `UPDATE webhook_deliveries
			SET state = 'dead', next_attempt_at = NULL, attempts = 10, last_status = 500, last_attempt_at = now()
			WHERE delivery_id = $1`, id)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected(), "fixture: delivery %s made dead", id)
		return id
	})
}

// prepare makes the objects every later call names: one of each kind per
// tenant (fleet secrets in the root tenant only).
func (fx *fixture) prepare(t *testing.T, root string, tenants ...string) {
	t.Helper()
	objs := map[string]string{}
	for _, tenant := range tenants {
		objs["site/"+tenant] = fx.site(t, tenant)
		objs["secret/"+tenant] = fx.secret(t, tenant, false)
		if tenant == root {
			objs["fleet-secret/"+tenant] = fx.secret(t, tenant, true)
		}
		// Kept until a call uses them up, which no refused call does.
		fx.webhook(t, tenant)
		fx.spareWebhook(t, tenant)
		fx.delivery(t, tenant)
		for _, prep := range preparers {
			prep(t, fx, tenant, objs)
		}
	}
	fx.prepared = objs
}

// inputs are the tenants a case is called on.
func (mc matrixCase) inputs(m *api.Method, root string) []string {
	switch {
	case !m.TenantScoped:
		return []string{""}
	case mc.rootInput:
		return []string{root}
	}
	return matrixTenants
}

func (mc matrixCase) label(m *api.Method) string {
	if mc.name == "" {
		return m.FullName
	}
	return m.FullName + "/" + mc.name
}

// publicRows calls every registered public method.
var publicRows = map[string]func(ctx context.Context, c *computeclient.Client) (any, error){
	api.MethodSystemWhoami: func(ctx context.Context, c *computeclient.Client) (any, error) {
		return c.SystemWhoami(ctx, &client.SystemWhoamiInput{})
	},
	api.MethodSystemVersion: func(ctx context.Context, c *computeclient.Client) (any, error) {
		return c.SystemVersion(ctx, &client.SystemVersionInput{})
	},
}

func registered(kinds ...api.Kind) []*api.Method {
	var out []*api.Method
	for _, m := range api.Methods {
		if m.Registered() && slices.Contains(kinds, m.Kind) {
			out = append(out, m)
		}
	}
	return out
}

var nonPublic = []api.Kind{api.KindRead, api.KindMutation}

func TestMatrixCoversEveryRegisteredMethod(t *testing.T) {
	t.Parallel()
	byName := map[string]*api.Method{}
	for _, m := range api.Methods {
		byName[m.FullName] = m
	}
	for _, m := range registered(nonPublic...) {
		_, ok := matrix[m.FullName]
		assert.Truef(t, ok, "%s is registered but has no row in the authorization matrix (internal/iam/e2e_test.go, var matrix)", m.FullName)
	}
	for _, m := range registered(api.KindPublic) {
		_, ok := publicRows[m.FullName]
		assert.Truef(t, ok, "public method %s has no row in publicRows (internal/iam/e2e_test.go)", m.FullName)
	}
	// Rows may come before their method is registered, never for a method
	// the catalog does not have, nor with a role that does not exist.
	for name, cases := range matrix {
		m, ok := byName[name]
		if !assert.Truef(t, ok, "matrix row %s names no method of the catalog", name) {
			continue
		}
		assert.NotEqualf(t, api.KindPublic, m.Kind, "matrix row %s is a public method: it belongs in publicRows", name)
		assert.NotEmptyf(t, cases, "matrix row %s has no case", name)
		for _, mc := range cases {
			for _, r := range slices.Concat(mc.tenantRoles, mc.rootRoles) {
				assert.Containsf(t, embedded.Roles, r, "matrix row %s", mc.label(m))
			}
			assert.NotNilf(t, mc.call, "matrix row %s has no call", mc.label(m))
			assert.NotNilf(t, mc.ok, "matrix row %s has no ok", mc.label(m))
			assert.Falsef(t, mc.rootInput && !m.TenantScoped, "matrix row %s: rootInput on a method without tenantId", mc.label(m))
		}
	}
	for name := range publicRows {
		m, ok := byName[name]
		if assert.Truef(t, ok, "publicRows names no method of the catalog: %s", name) {
			assert.Equal(t, api.KindPublic, m.Kind, name)
		}
	}
}

// ---------------------------------------------------------------------------
// Keys, clients and answers.

var matrixTenants = []string{"acme", "globex"}

// keyOf is a key of the keyring: its tenant, role and token.
type keyOf struct {
	tenant, identity, role, token, keyID string
}

func (k keyOf) name() string { return k.tenant + "/" + k.role }

// mintKeys creates a key of each role in acme, globex and the root tenant;
// identity <role>@<tenant>.
func mintKeys(t *testing.T, env *testenv.Env) []keyOf {
	t.Helper()
	var out []keyOf
	for _, tenant := range append(slices.Clone(matrixTenants), env.Config.RootTenantID) {
		for _, role := range embedded.Roles {
			identity := role + "@" + tenant
			tok, id := env.NewKey(t, tenant, identity, role)
			out = append(out, keyOf{tenant: tenant, identity: identity, role: role, token: tok, keyID: id})
		}
	}
	return out
}

// expectAdmitted says whether key k is admitted to m on input tenant in,
// and what a refusal proves.
func expectAdmitted(m *api.Method, mc matrixCase, root string, k keyOf, in string) (bool, string) {
	switch {
	case k.tenant == root:
		return slices.Contains(mc.rootRoles, k.role), "wrong role (root tenant " + k.role + ")"
	case m.TenantScoped && k.tenant != in:
		return false, "wrong tenant (" + k.tenant + " key on tenant " + in + ")"
	case !m.TenantScoped && len(mc.tenantRoles) == 0:
		return false, "wrong tenant (" + k.tenant + " key on a root-tenant method)"
	}
	return slices.Contains(mc.tenantRoles, k.role), "wrong role (" + k.role + ")"
}

func requireCode(t *testing.T, err error, code string, status int, msgAndArgs ...any) *computeclient.Error {
	t.Helper()
	e := testenv.APIError(t, err, msgAndArgs...)
	assert.Equal(t, code, e.Code, msgAndArgs...)
	assert.Equal(t, status, e.Status, msgAndArgs...)
	return e
}

// noCredential returns a client that sends no Authorization header (the
// generated client refuses to call a secured method without a token, so
// the token is dropped on the way out), then sets h and runs also on every
// request (the client takes one request editor).
func noCredential(t *testing.T, env *testenv.Env, h map[string]string, also ...func(*http.Request)) *computeclient.Client {
	return env.Client(t, computeclient.WithToken("dropped"), computeclient.WithRequestEditor(func(r *http.Request) {
		r.Header.Del("Authorization")
		for k, v := range h {
			r.Header.Set(k, v)
		}
		for _, f := range also {
			f(r)
		}
	}))
}

// withHeaders sets headers on every request.
func withHeaders(h map[string]string) computeclient.Option {
	return computeclient.WithRequestEditor(func(r *http.Request) {
		for k, v := range h {
			r.Header.Set(k, v)
		}
	})
}

func selfCheck(t *testing.T, c *computeclient.Client) (*client.SystemSelfCheckResult, error) {
	t.Helper()
	return c.SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
}

func whoami(t *testing.T, c *computeclient.Client) client.Caller {
	t.Helper()
	res, err := c.SystemWhoami(t.Context(), &client.SystemWhoamiInput{})
	require.NoError(t, err)
	return res.Data
}

// bodyRecorder keeps the raw body of the last response.
type bodyRecorder struct {
	mu   sync.Mutex
	body []byte
}

func (r *bodyRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	r.mu.Lock()
	r.body = b
	r.mu.Unlock()
	return resp, nil
}

func (r *bodyRecorder) last() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.body
}

// fakeClock is the injected clock of the identity caches.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

var epoch = time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)

func newClock() *fakeClock { return &fakeClock{t: epoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func withClock(clk *fakeClock) testenv.Option {
	return testenv.WithOverrides(host.Overrides{Now: clk.Now})
}

// setRole changes the role an identity holds in a tenant. The embedded
// service has no operation for it (create-key refuses another role as a
// conflict), so the test writes iam.role_bindings itself.
func setRole(t *testing.T, env *testenv.Env, tenant, identity, role string) {
	t.Helper()
	tag, err := env.Store.Pool().Exec(t.Context(),
		"UPDATE iam.role_bindings SET role = $3 WHERE tenant_id = $1 AND identity_id = $2", tenant, identity, role)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func dropRole(t *testing.T, env *testenv.Env, tenant, identity string) {
	t.Helper()
	tag, err := env.Store.Pool().Exec(t.Context(),
		"DELETE FROM iam.role_bindings WHERE tenant_id = $1 AND identity_id = $2", tenant, identity)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

// ---------------------------------------------------------------------------
// 1. The matrix.

// The matrix runs against every identity backend (backends_e2e_test.go):
// the embedded service, and decisions by a real SpiceDB.
func TestMatrixRefusesWrongTenantAndWrongRole(t *testing.T) {
	t.Parallel()
	for _, b := range identityBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			// Tunnels configured: the group exists only then; so is the
			// example plugin, whose methods are mounted only then.
			matrixOn(t, testenv.Start(t, withTunnels(t, b.yaml, testenv.ExamplePluginConfig(t)), b.env()), b)
		})
	}
}

func matrixOn(t *testing.T, env *testenv.Env, b backend) {
	keys := b.credentials(t, mintKeys(t, env))
	fx := newFixture(env, keys)
	root := env.Config.RootTenantID
	for _, m := range registered(nonPublic...) {
		for _, mc := range matrix[m.FullName] { // a method without a row fails TestMatrixCoversEveryRegisteredMethod
			t.Run(mc.label(m), func(t *testing.T) {
				var admitted, wrongTenant, wrongRole int
				for _, in := range mc.inputs(m, root) {
					for _, k := range keys {
						what := fmt.Sprintf("%s: key %s on tenant %q", mc.label(m), k.name(), in)
						res, err := mc.call(t, env.Client(t, computeclient.WithToken(k.token)), fx, in)
						ok, why := expectAdmitted(m, mc, root, k, in)
						if ok {
							require.NoError(t, err, what)
							mc.ok(t, res, in)
							admitted++
							continue
						}
						requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "%s: %s", what, why)
						if strings.HasPrefix(why, "wrong tenant") {
							wrongTenant++
						} else {
							wrongRole++
						}
					}
					_, err := mc.call(t, noCredential(t, env, nil), fx, in)
					requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, "%s without a credential", mc.label(m))
				}
				// The case must prove all three things.
				assert.Positive(t, admitted, "no key is admitted: the matrix proves no success")
				assert.Positive(t, wrongTenant, "no wrong-tenant refusal")
				assert.Positive(t, wrongRole, "no wrong-role refusal")
				t.Logf("%s: %d admitted, %d wrong-tenant and %d wrong-role refusals", mc.label(m), admitted, wrongTenant, wrongRole)
			})
		}
	}
}

// The brief's reading of the table for system.selfCheck, spelled out.
func TestSelfCheckIsForRootOwnersAndAdminsOnly(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	keys := mintKeys(t, env)
	for _, k := range keys {
		res, err := selfCheck(t, env.Client(t, computeclient.WithToken(k.token)))
		if k.tenant == env.Config.RootTenantID && (k.role == owner || k.role == admin) {
			require.NoError(t, err, k.name())
			assert.True(t, res.Data.Ok, k.name())
			assert.NotEmpty(t, res.Data.Findings, k.name())
			continue
		}
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, k.name())
	}
}

func TestPublicMethodsTakeAnyCredentialOrNone(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	keys := mintKeys(t, env)
	_, revoked := env.NewKey(t, "acme", "gone@acme", member)
	env.RevokeKey(t, revoked)
	clients := map[string]*computeclient.Client{
		"none":    env.Client(t),
		"garbage": env.Client(t, computeclient.WithToken("not-a-key")),
		"agent":   env.Client(t, computeclient.WithToken(env.Key(t, "acme", "bot-owner@acme", owner, testenv.KeyAgent("bot", "compute:fleet:admin")))),
	}
	for _, k := range keys {
		clients[k.name()] = env.Client(t, computeclient.WithToken(k.token))
	}
	for _, m := range registered(api.KindPublic) {
		call, ok := publicRows[m.FullName]
		if !ok {
			continue
		}
		for name, c := range clients {
			_, err := call(t.Context(), c)
			assert.NoError(t, err, "%s with %s", m.FullName, name)
		}
	}
}

func TestWhoamiDescribesTheCallerNeverItsSession(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	type want struct {
		tenant, identity, kind string
		mfa                    bool
		agent                  string
	}
	cases := map[string]struct {
		opts []testenv.KeyOption
		role string
		want want
	}{
		"acme member":     {role: member, want: want{tenant: "acme", identity: "ann@acme", kind: "user"}},
		"globex viewer":   {role: viewer, want: want{tenant: "globex", identity: "gus@globex", kind: "user"}},
		"root owner":      {role: owner, want: want{tenant: env.Config.RootTenantID, identity: "ops@root", kind: "user"}},
		"mfa key":         {role: admin, opts: []testenv.KeyOption{testenv.KeyMFA()}, want: want{tenant: "acme", identity: "mia@acme", kind: "user", mfa: true}},
		"service account": {role: member, opts: []testenv.KeyOption{testenv.KeyKind(embedded.KindService)}, want: want{tenant: "acme", identity: "ci@acme", kind: "service"}},
		"agent key": {role: owner, opts: []testenv.KeyOption{testenv.KeyAgent("deploy-bot", "compute:sites:manage")},
			want: want{tenant: "globex", identity: "gail@globex", kind: "user", agent: "deploy-bot"}},
		"agent identity": {role: member, opts: []testenv.KeyOption{testenv.KeyKind(embedded.KindAgent), testenv.KeyAgent("helper")},
			want: want{tenant: "acme", identity: "agent-7@acme", kind: "agent", agent: "helper"}},
	}
	for name, tc := range cases {
		tok, keyID := env.NewKey(t, tc.want.tenant, tc.want.identity, tc.role, tc.opts...)
		rec := &bodyRecorder{}
		c := whoami(t, env.Client(t, computeclient.WithToken(tok), computeclient.WithHTTPClient(&http.Client{Transport: rec})))
		assert.True(t, c.Authenticated, name)
		assert.Equal(t, tc.want.identity, c.IdentityId.Or(""), name)
		assert.Equal(t, tc.want.kind, c.IdentityKind.Or(""), name)
		assert.Equal(t, tc.want.tenant, c.TenantId.Or(""), name)
		assert.Equal(t, "api-key", c.SessionKind.Or(""), name)
		mfa, set := c.Mfa.Get()
		assert.True(t, set, name)
		assert.Equal(t, tc.want.mfa, mfa, name)

		wantFields := []string{"authenticated", "identityId", "identityKind", "tenantId", "sessionKind", "mfa"}
		if tc.want.agent != "" {
			assert.Equal(t, tc.want.agent, c.AgentId.Or(""), name)
			infos, err := env.Identity().ListKeys(t.Context(), tc.want.tenant)
			require.NoError(t, err)
			idx := slices.IndexFunc(infos, func(k embedded.KeyInfo) bool { return k.KeyID == keyID })
			require.GreaterOrEqual(t, idx, 0)
			assert.Equal(t, infos[idx].DelegationID, c.DelegationId.Or(""), name)
			assert.True(t, strings.HasPrefix(c.DelegationId.Or(""), "dlg_"), name)
			wantFields = append(wantFields, "agentId", "delegationId")
		} else {
			assert.False(t, c.AgentId.IsSet(), name)
			assert.False(t, c.DelegationId.IsSet(), name)
		}

		// The raw answer: exactly these fields, no session of any kind, and
		// nothing of the key (its id names the session, key:<keyid>).
		raw := rec.last()
		var body map[string]map[string]any
		require.NoError(t, json.Unmarshal(raw, &body), name)
		assert.ElementsMatch(t, wantFields, slices.Collect(maps.Keys(body["data"])), name)
		for k := range body["data"] {
			if k != "sessionKind" {
				assert.NotContains(t, strings.ToLower(k), "session", name)
			}
		}
		assert.NotContains(t, string(raw), `"session"`, name)
		assert.NotContains(t, string(raw), keyID, name)
		assert.NotContains(t, string(raw), "key:", name)
	}

	// Without a credential, only authenticated false.
	rec := &bodyRecorder{}
	c := whoami(t, env.Client(t, computeclient.WithHTTPClient(&http.Client{Transport: rec})))
	assert.False(t, c.Authenticated)
	assert.JSONEq(t, `{"data":{"authenticated":false}}`, string(rec.last()))
}

// ---------------------------------------------------------------------------
// 2. Refused calls leave nothing.

// countRows counts the rows of every table of every user schema (public,
// iam and any schema a later migration adds).
func countRows(t *testing.T, st *store.Store) map[string]int64 {
	t.Helper()
	ctx := t.Context()
	rows, err := st.Pool().Query(ctx, `SELECT n.nspname, c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p')
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
		  AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp%'
		ORDER BY 1, 2`)
	require.NoError(t, err)
	type rel struct{ Schema, Name string }
	rels, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rel])
	require.NoError(t, err)
	out := map[string]int64{}
	for _, r := range rels {
		var n int64
		require.NoError(t, st.Pool().QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{r.Schema, r.Name}.Sanitize()).Scan(&n))
		out[r.Schema+"."+r.Name] = n
	}
	// The census must see both schemas, or it proves nothing.
	require.Contains(t, out, "public.audit_log")
	require.Contains(t, out, "iam.api_keys")
	require.Contains(t, out, "iam.confirmations")
	return out
}

// countingSystem counts the calls that reach the system group's business
// functions.
type countingSystem struct {
	api.SystemService
	selfChecks atomic.Int32
}

func (s *countingSystem) SelfCheck(ctx context.Context, in *api.SystemSelfCheckInput) (*api.SelfCheck, error) {
	s.selfChecks.Add(1)
	return s.SystemService.SelfCheck(ctx, in)
}

// hostGate is the gate host.Assemble builds, on the env's identity port
// (embedded, or an external adapter in front of it) with caches of its own.
func hostGate(env *testenv.Env) *iam.Gate {
	return &iam.Gate{
		Port:         iam.NewCached(env.Host.Caches().Port, nil),
		TypePrefix:   env.Config.TypePrefix,
		AcceptCookie: env.Config.AcceptIAMCookie,
		Origin:       env.Config.BaseURL,
	}
}

// txObserver delegates to the host's gate and counts the calls the
// envelope takes into a transaction: it hears Finish (rpc.Finisher) only
// for admitted calls, deferred right before Store.WithTx. It is installed
// through host.Overrides.Gate, and the store only exists once the env
// started, hence the atomic pointer.
type txObserver struct {
	gate     atomic.Pointer[iam.Gate]
	finished atomic.Int32
	// refusedInTx counts the calls refused at the head of their
	// transaction (rpc.Settle): a create's admission on the embedded
	// port travels in its transaction's first pipeline.
	refusedInTx atomic.Int32
}

// isRefusal reports whether err is an answer of the gate's decision.
func isRefusal(err error) bool {
	var e *api.Error
	return errors.As(err, &e) && (e.Code == api.CodeAccessDenied || e.Code == api.CodeNotFound || e.Code == api.CodeConfirmationRequired)
}

func (o *txObserver) Admit(ctx context.Context, call *rpc.Call) (context.Context, error) {
	return o.gate.Load().Admit(ctx, call)
}

func (o *txObserver) Finish(ctx context.Context, err error) {
	o.finished.Add(1)
	if isRefusal(err) {
		o.refusedInTx.Add(1)
	}
	o.gate.Load().Finish(ctx, err)
}

func TestRefusedCallsLeaveNoRow(t *testing.T) {
	t.Parallel()
	for _, b := range identityBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			refusedCallsLeaveNoRow(t, b)
		})
	}
}

func refusedCallsLeaveNoRow(t *testing.T, b backend) {
	counter, txs := &countingSystem{}, &txObserver{}
	env := testenv.Start(t, withTunnels(t, b.yaml, testenv.ExamplePluginConfig(t)), b.env(),
		testenv.WithOverrides(host.Overrides{Gate: txs, Services: func(s *api.Services) {
			counter.SystemService = s.System
			s.System = counter
		}}))
	txs.gate.Store(hostGate(env))
	root := env.Config.RootTenantID
	keys := b.credentials(t, mintKeys(t, env))
	fx := newFixture(env, keys)
	fx.prepare(t, root, append(slices.Clone(matrixTenants), root)...) // objects the refused calls name
	revoked, revokedID := env.NewKey(t, "acme", "revoked@acme", owner)
	env.RevokeKey(t, revokedID)

	// An agent of a root admin whose delegation holds every registered
	// action for confirmation: its calls are refused with
	// CONFIRMATION_REQUIRED, and the policy records each confirmation asked.
	var actions []string
	for _, m := range registered(nonPublic...) {
		actions = append(actions, m.Action)
	}
	agent := env.Key(t, root, "ops-agent@root", admin, testenv.KeyAgent("deploy-bot", actions...))
	b.awaitRole(t, root, "ops-agent@root", admin)

	before := countRows(t, env.Store)
	txsBefore := txs.finished.Load()

	unauthenticated := map[string]*computeclient.Client{
		"no credential": noCredential(t, env, nil),
		"malformed":     env.Client(t, computeclient.WithToken("not-an-api-key")),
		"unknown":       env.Client(t, computeclient.WithToken("cpk_0123456789abcdef_0123456789abcdefghjkmnpqrstvwxyz")),
		"revoked":       env.Client(t, computeclient.WithToken(revoked)),
	}
	var refused, confirmations int
	for _, m := range registered(nonPublic...) {
		for _, mc := range matrix[m.FullName] {
			for _, in := range mc.inputs(m, root) {
				for _, k := range keys {
					if ok, _ := expectAdmitted(m, mc, root, k, in); ok {
						continue
					}
					_, err := mc.call(t, env.Client(t, computeclient.WithToken(k.token)), fx, in)
					requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "%s %s on %q", mc.label(m), k.name(), in)
					refused++
				}
				for name, c := range unauthenticated {
					_, err := mc.call(t, c, fx, in)
					requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, "%s %s", mc.label(m), name)
					refused++
				}
				if slices.Contains(mc.rootRoles, admin) {
					_, err := mc.call(t, env.Client(t, computeclient.WithToken(agent)), fx, in)
					requireCode(t, err, "CONFIRMATION_REQUIRED", http.StatusForbidden, "%s agent on %q", mc.label(m), in)
					refused++
					confirmations++
				}
			}
		}
	}
	require.Positive(t, refused)
	require.Positive(t, confirmations)

	after := countRows(t, env.Store)
	// Every table holds what it held, but iam.confirmations: the policy
	// records each confirmation it asks an agent for (docs/identity.md,
	// "Agent keys"), by design and outside any call transaction.
	want := maps.Clone(before)
	want["iam.confirmations"] += int64(confirmations)
	assert.Equal(t, want, after)
	assert.Equal(t, before["public.audit_log"], after["public.audit_log"], "no audit row for a refused call")
	// Only the calls refused at the head of their transaction were taken
	// into one, which rolled back (the census above): the creates on the
	// embedded port.
	assert.Equal(t, txsBefore+txs.refusedInTx.Load(), txs.finished.Load(), "no refused call is taken into a transaction but at its head")
	if b.name == "embedded" {
		assert.Positive(t, txs.refusedInTx.Load(), "creates are refused at the head of their transaction")
	} else {
		assert.Zero(t, txs.refusedInTx.Load(), "%s decides before any transaction", b.name)
	}
	assert.Zero(t, counter.selfChecks.Load(), "no refused call reaches a business function")
	t.Logf("%d refused calls (%d confirmations) over %d tables", refused, confirmations, len(after))

	// The census is not blind: an admitted call reaches the business function.
	rootOwner := keys[slices.IndexFunc(keys, func(k keyOf) bool { return k.tenant == root && k.role == owner })]
	_, err := selfCheck(t, env.Client(t, computeclient.WithToken(rootOwner.token)))
	require.NoError(t, err)
	assert.EqualValues(t, 1, counter.selfChecks.Load())
	assert.Equal(t, txsBefore+txs.refusedInTx.Load()+1, txs.finished.Load())

	// Nor is the census: an admitted mutation shows in it (its audit row).
	for _, m := range registered(api.KindMutation) {
		for _, mc := range matrix[m.FullName] {
			in := mc.inputs(m, root)[0]
			if ok, _ := expectAdmitted(m, mc, root, rootOwner, in); !ok {
				continue
			}
			_, err := mc.call(t, env.Client(t, computeclient.WithToken(rootOwner.token)), fx, in)
			require.NoError(t, err, mc.label(m))
			admitted := countRows(t, env.Store)
			assert.Equal(t, after["public.audit_log"]+1, admitted["public.audit_log"], mc.label(m))
			return
		}
	}
}

// ---------------------------------------------------------------------------
// 3. UNAUTHENTICATED and the caches.

func TestUnauthenticatedCredentials(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	good, goodID := env.NewKey(t, env.Config.RootTenantID, "ops@root", owner)
	revoked, revokedID := env.NewKey(t, env.Config.RootTenantID, "old@root", owner)
	env.RevokeKey(t, revokedID)
	unknown := "cpk_" + goodID + "_" + strings.Repeat("0", 32) // the right key id, another secret

	cases := map[string]struct {
		header  map[string]string
		message string
	}{
		"no credential":         {header: map[string]string{}, message: "credential is required"},
		"other scheme":          {header: map[string]string{"Authorization": "Basic " + good}, message: "credential is required"},
		"empty bearer":          {header: map[string]string{"Authorization": "Bearer "}, message: "credential is required"},
		"malformed":             {header: map[string]string{"Authorization": "Bearer not-a-key"}, message: "not valid"},
		"malformed upper case":  {header: map[string]string{"Authorization": "Bearer " + strings.ToUpper(good)}, message: "not valid"},
		"malformed truncated":   {header: map[string]string{"Authorization": "Bearer " + good[:len(good)-1]}, message: "not valid"},
		"unknown":               {header: map[string]string{"Authorization": "Bearer " + unknown}, message: "not valid"},
		"never issued":          {header: map[string]string{"Authorization": "Bearer cpk_0123456789abcdef_0123456789abcdefghjkmnpqrstvwxyz"}, message: "not valid"},
		"revoked before use":    {header: map[string]string{"Authorization": "Bearer " + revoked}, message: "not valid"},
		"token in cookie, off":  {header: map[string]string{"Cookie": iam.CookieName + "=" + good}, message: "credential is required"},
		"bearer twice in value": {header: map[string]string{"Authorization": "Bearer Bearer " + good}, message: "not valid"},
	}
	for name, tc := range cases {
		c := noCredential(t, env, tc.header)
		_, err := selfCheck(t, c)
		e := requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, name)
		assert.Contains(t, e.Message, tc.message, name)
		// A public method takes the same request as anonymous.
		assert.False(t, whoami(t, c).Authenticated, name)
	}
	_, err := selfCheck(t, env.Client(t, computeclient.WithToken(good)))
	require.NoError(t, err, "the good key works")
}

func TestRevokedKeyIsRefusedWhenTheCredentialCacheExpires(t *testing.T) {
	t.Parallel()
	clk := newClock()
	env := testenv.Start(t, withClock(clk))
	tok, keyID := env.NewKey(t, env.Config.RootTenantID, "ops@root", admin)
	c := env.Client(t, computeclient.WithToken(tok))

	_, err := selfCheck(t, c)
	require.NoError(t, err) // cached at epoch, until epoch+30s
	env.RevokeKey(t, keyID)

	_, err = selfCheck(t, c)
	require.NoError(t, err, "revoked, still cached")
	clk.Set(epoch.Add(iam.CredentialTTL - time.Second))
	_, err = selfCheck(t, c)
	require.NoError(t, err, "+29 s: still cached")
	assert.True(t, whoami(t, c).Authenticated, "+29 s: whoami answers from the same cache")

	clk.Set(epoch.Add(iam.CredentialTTL))
	_, err = selfCheck(t, c)
	requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, "+30 s: the cache expired, the revocation is seen")
	assert.False(t, whoami(t, c).Authenticated)

	// A refusal is never cached: later calls stay refused, and the key is
	// not re-admitted by any later cache entry.
	clk.Set(epoch.Add(time.Hour))
	_, err = selfCheck(t, c)
	requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized)
}

func TestAllowCacheAndDenials(t *testing.T) {
	t.Parallel()
	clk := newClock()
	env := testenv.Start(t, withClock(clk))
	root := env.Config.RootTenantID

	t.Run("a denial is never cached: a promoted viewer is admitted at once", func(t *testing.T) {
		tok := env.Key(t, root, "vic@root", viewer)
		c := env.Client(t, computeclient.WithToken(tok))
		_, err := selfCheck(t, c)
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden)
		setRole(t, env, root, "vic@root", admin)
		_, err = selfCheck(t, c) // same instant
		require.NoError(t, err)
	})

	t.Run("an allow is cached 10 s per session: a demoted admin is refused at +10 s", func(t *testing.T) {
		start := clk.Now()
		tok := env.Key(t, root, "ada@root", admin)
		other := env.Key(t, root, "ada@root", admin) // a second key: another session of the same identity
		c := env.Client(t, computeclient.WithToken(tok))
		_, err := selfCheck(t, c)
		require.NoError(t, err) // allow cached until start+10s

		setRole(t, env, root, "ada@root", viewer)
		_, err = selfCheck(t, c)
		require.NoError(t, err, "demoted, the allow is still cached")
		_, err = selfCheck(t, env.Client(t, computeclient.WithToken(other)))
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "the cache is per session: another key of the identity is decided afresh")

		clk.Set(start.Add(iam.AllowTTL - time.Millisecond))
		_, err = selfCheck(t, c)
		require.NoError(t, err, "+9.999 s: cached")
		clk.Set(start.Add(iam.AllowTTL))
		_, err = selfCheck(t, c)
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "+10 s: decided afresh")

		setRole(t, env, root, "ada@root", admin)
		_, err = selfCheck(t, c)
		require.NoError(t, err, "promoted again: admitted at once, the denial was not cached")
	})

	t.Run("a removed role binding is seen when the allow expires", func(t *testing.T) {
		start := clk.Now()
		tok := env.Key(t, root, "rob@root", owner)
		c := env.Client(t, computeclient.WithToken(tok))
		_, err := selfCheck(t, c)
		require.NoError(t, err)
		dropRole(t, env, root, "rob@root")
		clk.Set(start.Add(iam.AllowTTL - time.Millisecond))
		_, err = selfCheck(t, c)
		require.NoError(t, err)
		clk.Set(start.Add(iam.AllowTTL))
		_, err = selfCheck(t, c)
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden)
	})
}

// Require (mutations) is never cached. Until a mutation is registered this
// is shown on the port the host wires (iam.NewCached over the embedded
// service), with the same injected clock; TestMutationsAreDecidedAfresh
// shows it over HTTP for every registered mutation of the matrix.
func TestRequireIsNeverCachedAuthorizeIs(t *testing.T) {
	t.Parallel()
	clk := newClock()
	env := testenv.Start(t)
	root := env.Config.RootTenantID
	port := iam.NewCached(embedded.New(env.Store, root, env.Config.TypePrefix, clk.Now), clk.Now)
	tok := env.Key(t, root, "ada@root", admin)
	caller, err := port.Authenticate(t.Context(), iam.Credential{Token: tok})
	require.NoError(t, err)
	fleet := iam.Resource{Type: env.Config.TypePrefix + "fleet", ID: "global", TenantID: root}
	const action = "compute:fleet:admin"

	require.NoError(t, port.Require(t.Context(), caller, action, fleet))
	require.NoError(t, port.Authorize(t.Context(), caller, action, fleet))
	setRole(t, env, root, "ada@root", viewer)

	assert.ErrorIs(t, port.Require(t.Context(), caller, action, fleet), iam.ErrDenied, "Require sees the demotion at once")
	assert.NoError(t, port.Authorize(t.Context(), caller, action, fleet), "Authorize answers the cached allow")
	clk.Set(epoch.Add(iam.AllowTTL))
	assert.ErrorIs(t, port.Authorize(t.Context(), caller, action, fleet), iam.ErrDenied)
}

func TestMutationsAreDecidedAfresh(t *testing.T) {
	t.Parallel()
	mutations := registered(api.KindMutation)
	if len(mutations) == 0 {
		t.Skip("no registered mutation yet: TestRequireIsNeverCachedAuthorizeIs shows it on the port")
	}
	clk := newClock()
	// Tunnels and the example plugin configured: their methods exist
	// only then.
	env := testenv.Start(t, withClock(clk), withTunnels(t, testenv.ExamplePluginConfig(t)))
	root := env.Config.RootTenantID
	fx := newFixture(env, mintKeys(t, env))
	tested := 0
	for _, m := range mutations {
		for _, mc := range matrix[m.FullName] {
			in := mc.inputs(m, root)[0]
			tenant, roles := in, mc.tenantRoles
			if in == "" || in == root || len(roles) == 0 {
				tenant, roles = root, mc.rootRoles
			}
			var up, down string
			for _, r := range embedded.Roles { // highest first
				if slices.Contains(roles, r) && up == "" {
					up = r
				}
				if !slices.Contains(roles, r) {
					down = r
				}
			}
			if up == "" || down == "" {
				t.Logf("%s: no admitted and refused role pair in %s", mc.label(m), tenant)
				continue
			}
			identity := "mut-" + strings.NewReplacer(".", "-", "/", "-").Replace(mc.label(m)) + "@" + tenant
			c := env.Client(t, computeclient.WithToken(env.Key(t, tenant, identity, up)))
			res, err := mc.call(t, c, fx, in)
			require.NoError(t, err, mc.label(m))
			mc.ok(t, res, in)
			setRole(t, env, tenant, identity, down)
			_, err = mc.call(t, c, fx, in) // same instant: an allow cache would still answer
			requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden, "%s: a mutation is decided afresh", mc.label(m))
			tested++
		}
	}
	assert.Positive(t, tested)
}

// ---------------------------------------------------------------------------
// 4. Agent confirmations.

func TestAgentKeyConfirmationRequired(t *testing.T) {
	t.Parallel()
	clk := newClock()
	env := testenv.Start(t, withClock(clk))
	root := env.Config.RootTenantID
	tok := env.Key(t, root, "ops@root", admin, testenv.KeyAgent("deploy-bot", "compute:fleet:admin"))
	c := env.Client(t, computeclient.WithToken(tok))

	_, err := selfCheck(t, c)
	e := requireCode(t, err, "CONFIRMATION_REQUIRED", http.StatusForbidden)
	require.NotNil(t, e.Details)
	assert.ElementsMatch(t, []string{"confirmationId", "expiresAt", "action", "resource"}, slices.Collect(maps.Keys(e.Details)))
	id, _ := e.Details["confirmationId"].(string)
	assert.Regexp(t, `^cfm_[0-9a-hjkmnp-tv-z]{16}$`, id)
	assert.Equal(t, "compute:fleet:admin", e.Details["action"])
	assert.Equal(t, map[string]any{"type": "compute-fleet", "id": "global"}, e.Details["resource"])
	assert.Equal(t, epoch.Add(10*time.Minute).Format("2006-01-02T15:04:05.000Z"), e.Details["expiresAt"])

	// The confirmation is recorded for the delegation.
	var action, typ, rid string
	var expires time.Time
	require.NoError(t, env.Store.Pool().QueryRow(t.Context(),
		"SELECT action, resource_type, resource_id, expires_at FROM iam.confirmations WHERE id = $1", id).
		Scan(&action, &typ, &rid, &expires))
	assert.Equal(t, []string{"compute:fleet:admin", "compute-fleet", "global"}, []string{action, typ, rid})
	assert.True(t, expires.Equal(epoch.Add(10*time.Minute)))

	// Asked again, it asks again (a refusal is not cached).
	_, err = selfCheck(t, c)
	e2 := requireCode(t, err, "CONFIRMATION_REQUIRED", http.StatusForbidden)
	assert.NotEqual(t, id, e2.Details["confirmationId"])

	// An action off the list is done; an identity that may not do the
	// action is refused, never asked to confirm.
	free := env.Key(t, root, "ops2@root", admin, testenv.KeyAgent("deploy-bot", "compute:sites:manage"))
	_, err = selfCheck(t, env.Client(t, computeclient.WithToken(free)))
	require.NoError(t, err)
	weak := env.Key(t, root, "vie@root", viewer, testenv.KeyAgent("deploy-bot", "compute:fleet:admin"))
	_, err = selfCheck(t, env.Client(t, computeclient.WithToken(weak)))
	requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden)
	tenantAgent := env.Key(t, "acme", "own@acme", owner, testenv.KeyAgent("deploy-bot", "compute:fleet:admin"))
	_, err = selfCheck(t, env.Client(t, computeclient.WithToken(tenantAgent)))
	requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden)
}

// ---------------------------------------------------------------------------
// 5. The caller's address.

// The address the identity service is given is keyed into the credential
// cache (hash of the credential and the source address), so it can be
// observed through the real host wiring: a revoked key stays admitted from
// an address whose entry is cached and is refused from any other.
func TestSourceAddressKeysTheCredentialCache(t *testing.T) {
	t.Parallel()
	clk := newClock() // frozen: nothing expires during the test
	t.Run("trusted proxy", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t, withClock(clk),
			testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "trustedProxies: [127.0.0.1/32]\n")))
		tok, keyID := env.NewKey(t, env.Config.RootTenantID, "ops@root", admin)
		call := func(h map[string]string) error {
			_, err := selfCheck(t, env.Client(t, computeclient.WithToken(tok), withHeaders(h)))
			return err
		}
		require.NoError(t, call(map[string]string{"X-Forwarded-For": "203.0.113.7"}))
		env.RevokeKey(t, keyID)

		for name, h := range map[string]map[string]string{
			"same address":                    {"X-Forwarded-For": "203.0.113.7"},
			"read right to left":              {"X-Forwarded-For": "198.51.100.9, 203.0.113.7"},
			"trusted hops skipped":            {"X-Forwarded-For": "203.0.113.7, 127.0.0.1"},
			"IPv4-mapped IPv6 is IPv4":        {"X-Forwarded-For": "::ffff:203.0.113.7"},
			"other headers change no address": {"X-Forwarded-For": "203.0.113.7", "Forwarded": "for=198.51.100.9", "X-Real-IP": "198.51.100.9"},
		} {
			assert.NoError(t, call(h), "%s: the cached entry of 203.0.113.7 answers", name)
		}
		for name, h := range map[string]map[string]string{
			"another address":               {"X-Forwarded-For": "198.51.100.9"},
			"leftmost is not the caller":    {"X-Forwarded-For": "203.0.113.7, 198.51.100.9"},
			"no X-Forwarded-For: none":      {},
			"Forwarded is not believed":     {"Forwarded": "for=203.0.113.7"},
			"X-Real-IP is not believed":     {"X-Real-IP": "203.0.113.7"},
			"True-Client-IP is not belived": {"True-Client-IP": "203.0.113.7"},
			"malformed hop: none":           {"X-Forwarded-For": "203.0.113.7, garbage"},
		} {
			assert.Equal(t, "UNAUTHENTICATED", testenv.APIError(t, call(h), name).Code, "%s: a fresh lookup sees the revocation", name)
		}
	})
	t.Run("untrusted peer", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t, withClock(clk))
		tok, keyID := env.NewKey(t, env.Config.RootTenantID, "ops@root", admin)
		call := func(xff string) error {
			_, err := selfCheck(t, env.Client(t, computeclient.WithToken(tok), withHeaders(map[string]string{"X-Forwarded-For": xff})))
			return err
		}
		require.NoError(t, call("203.0.113.7"))
		env.RevokeKey(t, keyID)
		// The peer (127.0.0.1) is the address whatever the header claims.
		assert.NoError(t, call("198.51.100.9"))
		assert.NoError(t, call("10.0.0.1, 192.0.2.1"))
	})
}

// observingPort records the address each credential reaches the identity
// service with.
type observingPort struct {
	iam.Port
	mu   sync.Mutex
	seen []netip.Addr
}

func (p *observingPort) Authenticate(ctx context.Context, cred iam.Credential) (*iam.Caller, error) {
	p.mu.Lock()
	p.seen = append(p.seen, cred.SourceIP)
	p.mu.Unlock()
	return p.Port.Authenticate(ctx, cred)
}

func (p *observingPort) last() netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		return netip.Addr{}
	}
	return p.seen[len(p.seen)-1]
}

// observingGate records the request headers the envelope hands the gate,
// then admits as the host's gate does: the host's own iam.Gate type, built
// as host.Assemble builds it, with observingPort between the cache and the
// embedded service. It is installed through host.Overrides.Gate, whose
// store only exists once the env started, hence the atomic pointer.
type observingGate struct {
	gate    atomic.Pointer[iam.Gate]
	mu      sync.Mutex
	headers http.Header
	ctxAddr netip.Addr
}

func (g *observingGate) Admit(ctx context.Context, call *rpc.Call) (context.Context, error) {
	g.mu.Lock()
	g.headers = call.Request.Header.Clone()
	g.ctxAddr = iam.SourceIPFromContext(call.Request.Context())
	g.mu.Unlock()
	return g.gate.Load().Admit(ctx, call)
}

func (g *observingGate) last() (http.Header, netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.headers, g.ctxAddr
}

// versionFromAddress is a system double whose version answers, in name,
// the verified address its business function sees.
type versionFromAddress struct{ api.SystemService }

func (v versionFromAddress) Version(ctx context.Context, _ *api.SystemVersionInput) (*api.ServerDocument, error) {
	return &api.ServerDocument{Name: "addr=" + iam.SourceIPFromContext(ctx).String()}, nil
}

func TestForwardingHeadersNeverReachTheHandler(t *testing.T) {
	t.Parallel()
	for _, trusted := range []bool{true, false} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			t.Parallel()
			gate := &observingGate{}
			opts := []testenv.Option{testenv.WithOverrides(host.Overrides{
				Gate:     gate,
				Services: func(s *api.Services) { s.System = versionFromAddress{s.System} },
			})}
			if trusted {
				opts = append(opts, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "trustedProxies: [127.0.0.1/32]\n")))
			}
			env := testenv.Start(t, opts...)
			port := &observingPort{Port: embedded.New(env.Store, env.Config.RootTenantID, env.Config.TypePrefix, nil)}
			gate.gate.Store(&iam.Gate{Port: iam.NewCached(port, nil), TypePrefix: env.Config.TypePrefix, Origin: env.Config.BaseURL})

			claims := map[string]string{
				"Forwarded":           "for=198.51.100.1;proto=https",
				"X-Real-IP":           "198.51.100.2",
				"X-Client-IP":         "198.51.100.3",
				"True-Client-IP":      "198.51.100.4",
				"CF-Connecting-IP":    "198.51.100.5",
				"Fastly-Client-IP":    "198.51.100.6",
				"X-Cluster-Client-IP": "198.51.100.7",
			}
			cases := []struct {
				name, xff, want string // want "" is no address
			}{
				{"one hop", "203.0.113.7", "203.0.113.7"},
				{"right to left", "198.51.100.9, 203.0.113.8", "203.0.113.8"},
				{"trusted hop skipped", "203.0.113.9, 127.0.0.1", "203.0.113.9"},
				{"every hop trusted: leftmost", "127.0.0.1, 127.0.0.1", "127.0.0.1"},
				{"IPv4-mapped", "::ffff:203.0.113.10", "203.0.113.10"},
				{"malformed", "203.0.113.11, not-an-ip", ""},
				{"absent", "", ""},
			}
			for _, tc := range cases {
				want := tc.want
				if !trusted {
					want = "127.0.0.1" // the peer, whatever is claimed
				}
				h := maps.Clone(claims)
				if tc.xff != "" {
					h["X-Forwarded-For"] = tc.xff
				}
				// A fresh key per case, so the cache never answers for the
				// identity service.
				tok := env.Key(t, env.Config.RootTenantID, fmt.Sprintf("ops-%v-%s@root", trusted, strings.ReplaceAll(tc.name, " ", "-")), admin)
				_, err := selfCheck(t, env.Client(t, computeclient.WithToken(tok), withHeaders(h)))
				require.NoError(t, err, tc.name)

				seen := port.last()
				headers, ctxAddr := gate.last()
				if want == "" {
					assert.False(t, seen.IsValid(), "%s: the identity service is given no address, got %s", tc.name, seen)
					assert.Empty(t, headers.Values("X-Forwarded-For"), tc.name)
				} else {
					assert.Equal(t, want, seen.String(), "%s: address given to the identity service", tc.name)
					assert.Equal(t, []string{want}, headers.Values("X-Forwarded-For"), "%s: X-Forwarded-For is replaced by the verified address", tc.name)
				}
				assert.Equal(t, seen, ctxAddr, tc.name)
				for name := range claims {
					assert.Empty(t, headers.Values(name), "%s: %s reaches the handler", tc.name, name)
				}
				assert.Empty(t, headers.Values("X-Original-Forwarded-For"), tc.name)

				// The business function sees the same verified address.
				v, err := env.Client(t, withHeaders(h)).SystemVersion(t.Context(), &client.SystemVersionInput{})
				require.NoError(t, err)
				if want == "" {
					assert.Equal(t, "addr=invalid IP", v.Data.Name, tc.name)
				} else {
					assert.Equal(t, "addr="+want, v.Data.Name, tc.name)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------
// 6. The session cookie.

func TestSessionCookie(t *testing.T) {
	t.Parallel()
	t.Run("accepted on same-origin requests", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "acceptIamCookie: true\n")))
		tok := env.Key(t, env.Config.RootTenantID, "ops@root", admin)
		cookie := iam.CookieName + "=" + tok
		origin := env.Config.BaseURL

		same := noCredential(t, env, map[string]string{"Origin": origin, "Cookie": cookie})
		c := whoami(t, same)
		assert.True(t, c.Authenticated)
		assert.Equal(t, "ops@root", c.IdentityId.Or(""))
		_, err := selfCheck(t, same)
		require.NoError(t, err, "the cookie authenticates non-public methods too")

		referer := noCredential(t, env, map[string]string{"Referer": origin + "/console/page", "Cookie": cookie})
		assert.True(t, whoami(t, referer).Authenticated, "without Origin, a same-origin Referer")

		for name, h := range map[string]map[string]string{
			"other origin":         {"Origin": "https://evil.example", "Cookie": cookie},
			"other port":           {"Origin": origin + "1", "Cookie": cookie},
			"other scheme":         {"Origin": strings.Replace(origin, "http://", "https://", 1), "Cookie": cookie},
			"null origin":          {"Origin": "null", "Cookie": cookie},
			"no origin or referer": {"Cookie": cookie},
			"other referer":        {"Referer": "https://evil.example/x", "Cookie": cookie},
		} {
			cl := noCredential(t, env, h)
			_, err := cl.SystemWhoami(t.Context(), &client.SystemWhoamiInput{})
			requireCode(t, err, "UNTRUSTED_ORIGIN", http.StatusForbidden, name)
			_, err = selfCheck(t, cl)
			requireCode(t, err, "UNTRUSTED_ORIGIN", http.StatusForbidden, name)
		}

		// X-Service: 1 is required first (the envelope's CSRF guard).
		_, err = noCredential(t, env, map[string]string{"Origin": origin, "Cookie": cookie},
			func(r *http.Request) { r.Header.Del("X-Service") }).
			SystemWhoami(t.Context(), &client.SystemWhoamiInput{})
		requireCode(t, err, "CSRF_REJECTED", http.StatusForbidden)

		// A revoked key in the cookie is no better than in the header.
		bad := noCredential(t, env, map[string]string{"Origin": origin, "Cookie": iam.CookieName + "=not-a-key"})
		assert.False(t, whoami(t, bad).Authenticated)
		_, err = selfCheck(t, bad)
		requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized)
	})
	t.Run("ignored unless acceptIamCookie", func(t *testing.T) {
		t.Parallel()
		env := testenv.Start(t)
		require.False(t, env.Config.AcceptIAMCookie)
		tok := env.Key(t, env.Config.RootTenantID, "ops@root", admin)
		for name, h := range map[string]map[string]string{
			"same origin":  {"Origin": env.Config.BaseURL, "Cookie": iam.CookieName + "=" + tok},
			"other origin": {"Origin": "https://evil.example", "Cookie": iam.CookieName + "=" + tok},
		} {
			cl := noCredential(t, env, h)
			assert.False(t, whoami(t, cl).Authenticated, name)
			_, err := selfCheck(t, cl)
			requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized, name)
		}
	})
}

// ---------------------------------------------------------------------------
// 7. Metrics.

const metricsToken = "metrics-token-0123456789"

func scrape(t *testing.T, env *testenv.Env) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, env.URL+env.Config.Metrics.Path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+metricsToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// sample returns the value of the sample of name with exactly labels, -1
// when there is none.
func sample(text, name string, labels map[string]string) float64 {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, labels[k]))
	}
	prefix := name + "{" + strings.Join(parts, ",") + "} "
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func TestDeniedCallsAreCounted(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_METRICS_TOKEN", metricsToken))
	root := env.Config.RootTenantID
	ok := env.Key(t, root, "ops@root", admin)
	tenantOwner := env.Key(t, "acme", "own@acme", owner)
	agent := env.Key(t, root, "bot-op@root", admin, testenv.KeyAgent("bot", "compute:fleet:admin"))

	_, err := selfCheck(t, env.Client(t, computeclient.WithToken(ok)))
	require.NoError(t, err)
	for range 2 {
		_, err = selfCheck(t, noCredential(t, env, nil))
		requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized)
	}
	_, err = selfCheck(t, env.Client(t, computeclient.WithToken("not-a-key")))
	requireCode(t, err, "UNAUTHENTICATED", http.StatusUnauthorized)
	for range 3 {
		_, err = selfCheck(t, env.Client(t, computeclient.WithToken(tenantOwner)))
		requireCode(t, err, "ACCESS_DENIED", http.StatusForbidden)
	}
	_, err = selfCheck(t, env.Client(t, computeclient.WithToken(agent)))
	requireCode(t, err, "CONFIRMATION_REQUIRED", http.StatusForbidden)

	text := scrape(t, env)
	denied := func(code string) float64 {
		return sample(text, "compute_rpc_denied_total", map[string]string{"method": api.MethodSystemSelfCheck, "code": code})
	}
	assert.Equal(t, 3.0, denied("UNAUTHENTICATED"), "401s")
	assert.Equal(t, 3.0, denied("ACCESS_DENIED"), "403s")
	assert.Equal(t, 1.0, denied("CONFIRMATION_REQUIRED"), "403s")
	assert.Equal(t, -1.0, denied("OK"), "a success is no denial")
	assert.Equal(t, 1.0, sample(text, "compute_rpc_requests_total", map[string]string{"method": api.MethodSystemSelfCheck, "code": "OK"}))
	assert.Equal(t, 3.0, sample(text, "compute_rpc_requests_total", map[string]string{"method": api.MethodSystemSelfCheck, "code": "ACCESS_DENIED"}))
}
