package iam_test

// Benchmarks of the decision path: iam.Gate.Admit on the rpc.Call of
// system.selfCheck with a root admin key, against the real embedded
// identity service on PostgreSQL, behind iam.NewCached as host.Assemble
// wires it.
//
//	go test -run '^$' -bench Decision -benchmem ./internal/iam/

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/internal/dbtest"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/rpc"
)

// benchClock is a clock the cold benchmark moves past both cache windows.
type benchClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *benchClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *benchClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// benchDecision returns the host's gate over a fresh database, a call of
// system.selfCheck made with a root admin key (its request carrying the
// verified source address as iam.WithSourceIP leaves it), and the clock of
// the caches.
func benchDecision(b *testing.B) (*iam.Gate, *rpc.Call, *benchClock) {
	b.Helper()
	st := dbtest.NewStore(b)
	clk := &benchClock{t: time.Now()}
	svc := embedded.New(st, "", "", clk.Now)
	token, _, err := svc.CreateKey(b.Context(), embedded.KeyRequest{Tenant: embedded.DefaultRootTenant, Identity: "ops@root", Role: embedded.RoleAdmin})
	if err != nil {
		b.Fatal(err)
	}
	gate := &iam.Gate{Port: iam.NewCached(svc, clk.Now), TypePrefix: embedded.DefaultTypePrefix, Origin: "http://localhost:3000"}

	m := api.Lookup("/system/selfCheck")
	if m == nil {
		b.Fatal("system.selfCheck is not in the registry")
	}
	var req *http.Request
	raw := httptest.NewRequestWithContext(b.Context(), http.MethodPost, "/api/compute/system/selfCheck", nil)
	raw.RemoteAddr = "192.0.2.10:40000"
	iam.WithSourceIP(nil, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { req = r })).
		ServeHTTP(httptest.NewRecorder(), raw)
	call := &rpc.Call{
		Method:     m,
		Input:      &api.SystemSelfCheckInput{},
		Fields:     map[string]any{},
		RequestID:  "req_bench",
		Credential: token,
		Request:    req,
	}
	return gate, call, clk
}

func admit(b *testing.B, gate *iam.Gate, call *rpc.Call) {
	ctx, err := gate.Admit(b.Context(), call)
	if err != nil {
		b.Fatal(err)
	}
	if iam.SessionFromContext(ctx) == nil {
		b.Fatal("admitted without a session")
	}
}

// BenchmarkDecisionWarm: the credential (30 s) and the allow (10 s) are
// cached, so the decision costs no database round trip.
func BenchmarkDecisionWarm(b *testing.B) {
	gate, call, _ := benchDecision(b)
	admit(b, gate, call) // warm both caches
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		admit(b, gate, call)
	}
}

// BenchmarkDecisionWarmParallel is the warm path from GOMAXPROCS goroutines
// (the caches share one mutex).
func BenchmarkDecisionWarmParallel(b *testing.B) {
	gate, call, _ := benchDecision(b)
	admit(b, gate, call)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := gate.Admit(b.Context(), call); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkDecisionCold: each iteration moves the clock past the credential
// window, so both caches miss: Authenticate (the key by its hash) and
// Authorize (the root-tenant role for fleet/global) go to PostgreSQL.
func BenchmarkDecisionCold(b *testing.B) {
	gate, call, clk := benchDecision(b)
	admit(b, gate, call)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		clk.Add(iam.CredentialTTL)
		admit(b, gate, call)
	}
}

// BenchmarkDecisionWarmObjectRead is the warm path of a read naming an
// object (sites.get by an acme viewer): the credential and the allow are
// cached, but the gate still asks the projection whether the object is
// visible in the call's tenant before deciding, one database round trip
// per call that no cache covers.
func BenchmarkDecisionWarmObjectRead(b *testing.B) {
	st := dbtest.NewStore(b)
	svc := embedded.New(st, "", "", nil)
	token, _, err := svc.CreateKey(b.Context(), embedded.KeyRequest{Tenant: "acme", Identity: "vic@acme", Role: embedded.RoleViewer})
	if err != nil {
		b.Fatal(err)
	}
	const siteID = "site_0123456789abcdefghjkmnpqrs"
	err = st.WithTx(b.Context(), false, func(ctx context.Context, tx pgx.Tx) error {
		return svc.Projection().Put(ctx, tx, iam.Resource{Type: "compute-site", ID: siteID, TenantID: "acme", Owner: "vic@acme"})
	})
	if err != nil {
		b.Fatal(err)
	}
	gate := &iam.Gate{Port: iam.NewCached(svc, nil), TypePrefix: embedded.DefaultTypePrefix}
	m := api.Lookup("/sites/get")
	if m == nil || !m.Registered() {
		b.Skip("sites.get is not registered")
	}
	raw := httptest.NewRequestWithContext(b.Context(), http.MethodPost, "/api/compute/sites/get", nil)
	call := &rpc.Call{
		Method:     m,
		Fields:     map[string]any{"tenantId": "acme", "siteId": siteID},
		RequestID:  "req_bench",
		Credential: token,
		Request:    raw,
	}
	admit(b, gate, call)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		admit(b, gate, call)
	}
}
