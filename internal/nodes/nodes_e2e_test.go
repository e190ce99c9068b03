package nodes_test

// nodes through the generated client over HTTP: every state change and
// refusal, with nodes entered by nodes.Register (computed nodes register).

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/nodes"
	"computeplane/internal/placement"
	"computeplane/internal/testenv"
)

type world struct {
	env          *testenv.Env
	acme, globex *computeclient.Client
	pool         string
}

func setup(t *testing.T) *world {
	t.Helper()
	env := testenv.Start(t)
	w := &world{env: env,
		acme:   env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "owner"))),
		globex: env.Client(t, computeclient.WithToken(env.Key(t, "globex", "gus", "owner"))),
	}
	site, err := w.acme.SitesCreate(t.Context(), &client.SitesCreateInput{TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "s"})
	require.NoError(t, err)
	pool, err := w.acme.PoolsCreate(t.Context(), &client.PoolsCreateInput{TenantId: "acme", SiteId: site.Data.SiteId, Name: "p",
		Class: client.PoolsCreateInputClassVpsHost, IdempotencyKey: "p"})
	require.NoError(t, err)
	w.pool = pool.Data.PoolId
	return w
}

func (w *world) register(t *testing.T, host string) string {
	t.Helper()
	n, err := nodes.Register(t.Context(), w.env.Store, w.env.Host.Identity().Projection(), w.env.Config.TypePrefix, nodes.Registration{
		PoolID: w.pool, Hostname: host, VCPU: 16, MemoryMiB: 65536, DiskGiB: 500, GPUModel: "L4", GPUs: 2, Labels: map[string]string{"rack": "r1"},
	})
	require.NoError(t, err)
	return n.NodeID
}

func code(t *testing.T, err error) string { t.Helper(); return testenv.APIError(t, err).Code }

func TestRegisteredNodeReads(t *testing.T) {
	t.Parallel()
	w := setup(t)
	id := w.register(t, "h1")
	got, err := w.acme.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "acme", NodeId: id})
	require.NoError(t, err)
	n := got.Data
	assert.Equal(t, "ready", string(n.State))
	assert.Equal(t, "acme", n.TenantId)
	assert.Equal(t, w.pool, n.PoolId)
	assert.True(t, n.Declared)
	assert.Equal(t, int64(16), n.Capacity.Vcpu)
	assert.Equal(t, []client.NodeGPU{{Model: "L4", Count: 2}}, n.Capacity.Gpus)
	assert.Equal(t, int64(0), n.Booked.Vcpu)
	assert.True(t, n.VolumeStore.Null, "no volume store reported yet")
	assert.True(t, n.Session.Null)
	assert.Equal(t, client.NodeLabels{"rack": "r1"}, n.Labels)

	_, err = w.globex.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "globex", NodeId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's node")
	_, err = w.acme.NodesGet(t.Context(), &client.NodesGetInput{TenantId: "acme", NodeId: "node_0000000000000000000000000z"})
	assert.Equal(t, "NOT_FOUND", code(t, err))

	w.register(t, "h0")
	list, err := w.acme.NodesList(t.Context(), &client.NodesListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, list.Data.Items, 2)
	assert.Equal(t, "h0", list.Data.Items[0].Hostname, "by hostname")
	other, err := w.globex.NodesList(t.Context(), &client.NodesListInput{TenantId: "globex"})
	require.NoError(t, err)
	assert.Empty(t, other.Data.Items)

	require.Eventually(t, func() bool {
		res, err := w.acme.EventsList(t.Context(), &client.EventsListInput{TenantId: "acme", Types: []string{"node.registered"}})
		return err == nil && len(res.Data.Items) == 2
	}, 10*time.Second, 50*time.Millisecond)
}

func TestStateMachine(t *testing.T) {
	t.Parallel()
	w := setup(t)
	id := w.register(t, "h1")
	state := func(n client.Node) string { return string(n.State) }

	c, err := w.acme.NodesCordon(t.Context(), &client.NodesCordonInput{TenantId: "acme", NodeId: id, Reason: client.NewOptString("disk swap")})
	require.NoError(t, err)
	assert.Equal(t, "cordoned", state(c.Data))
	again, err := w.acme.NodesCordon(t.Context(), &client.NodesCordonInput{TenantId: "acme", NodeId: id})
	require.NoError(t, err)
	assert.Equal(t, c.Data.Version, again.Data.Version, "cordoning twice changes nothing")

	// A cordoned node takes no new work.
	e := placement.New(placement.Options{})
	var booking *placement.Booking
	admit := func() error {
		return w.env.Store.WithTx(context.Background(), false, func(ctx context.Context, tx pgx.Tx) (err error) {
			booking, err = e.Admit(ctx, tx, placement.Request{TenantID: "acme", PoolID: w.pool, Owner: placement.Owner{Type: "test", ID: "x"},
				Shape: placement.Shape{VCPU: 1, MemoryMiB: 1}})
			return err
		})
	}
	var refused *api.Error
	require.ErrorAs(t, admit(), &refused)
	assert.Equal(t, api.CodeCapacityUnavailable, refused.Code)

	u, err := w.acme.NodesUncordon(t.Context(), &client.NodesUncordonInput{TenantId: "acme", NodeId: id})
	require.NoError(t, err)
	assert.Equal(t, "ready", state(u.Data))
	require.NoError(t, admit(), "ready again: it takes work")

	d, err := w.acme.NodesDrain(t.Context(), &client.NodesDrainInput{TenantId: "acme", NodeId: id})
	require.NoError(t, err)
	assert.Equal(t, "draining", state(d.Data))
	assert.Equal(t, int64(1), d.Data.Booked.Vcpu, "what runs on it stays booked")
	_, err = w.acme.NodesCordon(t.Context(), &client.NodesCordonInput{TenantId: "acme", NodeId: id})
	assert.Equal(t, "INVALID_STATE", code(t, err), "a draining node is not cordoned")
	_, err = w.acme.NodesRetire(t.Context(), &client.NodesRetireInput{TenantId: "acme", NodeId: id})
	assert.Equal(t, "INVALID_STATE", code(t, err), "a booking still holds it")

	require.NoError(t, w.env.Store.WithTx(context.Background(), false, func(ctx context.Context, tx pgx.Tx) error {
		return e.Release(ctx, tx, booking.ID, nil)
	}))
	r, err := w.acme.NodesRetire(t.Context(), &client.NodesRetireInput{TenantId: "acme", NodeId: id})
	require.NoError(t, err)
	assert.Equal(t, "retired", state(r.Data))
	_, err = w.acme.NodesUncordon(t.Context(), &client.NodesUncordonInput{TenantId: "acme", NodeId: id})
	assert.Equal(t, "INVALID_STATE", code(t, err), "retired for good")
	list, err := w.acme.NodesList(t.Context(), &client.NodesListInput{TenantId: "acme"})
	require.NoError(t, err)
	assert.Empty(t, list.Data.Items, "retired nodes are left out unless asked for")
	list, err = w.acme.NodesList(t.Context(), &client.NodesListInput{TenantId: "acme", State: client.NewOptNodesListInputState(client.NodesListInputStateRetired)})
	require.NoError(t, err)
	assert.Len(t, list.Data.Items, 1)

	_, err = w.globex.NodesCordon(t.Context(), &client.NodesCordonInput{TenantId: "globex", NodeId: id})
	assert.Equal(t, "NOT_FOUND", code(t, err), "another tenant's node")

	require.Eventually(t, func() bool {
		res, err := w.acme.EventsList(t.Context(), &client.EventsListInput{TenantId: "acme", Types: []string{"node.cordoned", "node.uncordoned", "node.draining", "node.retired"}})
		return err == nil && len(res.Data.Items) == 4
	}, 10*time.Second, 50*time.Millisecond, "one event per change, none for a repeat")
}

func TestLabels(t *testing.T) {
	t.Parallel()
	w := setup(t)
	id := w.register(t, "h1")
	n, err := w.acme.NodesLabel(t.Context(), &client.NodesLabelInput{TenantId: "acme", NodeId: id,
		Set: client.NewOptNodesLabelInputSet(client.NodesLabelInputSet{"zone": "a", "tier": "gold"}), Remove: []string{"rack"}})
	require.NoError(t, err)
	assert.Equal(t, client.NodeLabels{"zone": "a", "tier": "gold"}, n.Data.Labels)
	_, err = w.acme.NodesLabel(t.Context(), &client.NodesLabelInput{TenantId: "acme", NodeId: id,
		Set: client.NewOptNodesLabelInputSet(client.NodesLabelInputSet{"zone": "b"}), Remove: []string{"zone"}})
	assert.Equal(t, "INVALID_INPUT", code(t, err), "set and removed at once")
	_, err = w.acme.NodesLabel(t.Context(), &client.NodesLabelInput{TenantId: "acme", NodeId: id,
		Set: client.NewOptNodesLabelInputSet(client.NodesLabelInputSet{"Bad Key": "x"})})
	assert.Equal(t, "INVALID_INPUT", code(t, err))
	require.Eventually(t, func() bool {
		res, err := w.acme.EventsList(t.Context(), &client.EventsListInput{TenantId: "acme", Types: []string{"node.labeled"}})
		return err == nil && len(res.Data.Items) == 1
	}, 10*time.Second, 50*time.Millisecond, "one node.labeled for the one change")
}

func TestSelfCheckFleetFindings(t *testing.T) {
	t.Parallel()
	w := setup(t)
	root := w.env.Client(t, computeclient.WithToken(w.env.Key(t, w.env.Config.RootTenantID, "ops", "owner")))
	fleet := func() (findings []client.Finding, ok bool) {
		t.Helper()
		res, err := root.SystemSelfCheck(t.Context(), &client.SystemSelfCheckInput{})
		require.NoError(t, err)
		for _, f := range res.Data.Findings {
			if f.Check == "fleet" {
				findings = append(findings, f)
			}
		}
		return findings, res.Data.Ok
	}
	f, ok := fleet()
	require.Len(t, f, 1)
	assert.Equal(t, "info", string(f[0].Severity))
	assert.True(t, ok)

	// A daemon-run node counted ready without a session.
	id := w.register(t, "h1")
	_, err := w.env.Store.Pool().Exec(t.Context(), `update nodes set declared = false where node_id = $1`, id)
	require.NoError(t, err)
	f, _ = fleet()
	require.Len(t, f, 2)
	assert.Equal(t, "warning", string(f[1].Severity))
	assert.Contains(t, f[1].Message, "1 daemon-run nodes")

	// Over-commit is reported as an error, should the constraint ever go.
	_, err = w.env.Store.Pool().Exec(t.Context(), `alter table nodes drop constraint nodes_booked_within_capacity;
		update nodes set booked_vcpu = cap_vcpu + 1 where node_id = '`+id+`'`)
	require.NoError(t, err)
	f, ok = fleet()
	assert.Equal(t, "error", string(f[0].Severity))
	assert.False(t, ok)
}
