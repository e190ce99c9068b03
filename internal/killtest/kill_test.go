package killtest_test

// The kill test (issue 5, "What it must show", first bullet): a process
// holding the dispatch leases is killed with SIGKILL in the middle of
// dispatch; another takes over once the leases expire, and every event
// reaches the file sink and the webhook receiver at least once, none lost,
// shown by counting. See docs/killtest.md.
//
// Two computed processes share one database and one configuration (apart
// from workers.id): A serves the API and has the sinks role, B has the
// sinks role only. Their worker ids are chosen so that rendezvous hashing
// gives B both singleton jobs (the file sink's and "webhooks"); A releases
// them when B joins. Events are sites created through A's API at a steady
// pace; B is killed while a webhook attempt is in flight at the receiver,
// events keep coming through A, and A takes the leases over when they
// expire. Counting is by event id: the outbox against the sink file's
// lines and against the requests the receiver got.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/proctest"
	"computeplane/internal/sinks"
	"computeplane/internal/testenv"
	"computeplane/internal/webhooks"
	"computeplane/internal/workers"
)

const (
	numEvents = 300                   // sites created, one event each
	killAfter = 100                   // events created before the kill
	pace      = 25 * time.Millisecond // between two creates
	// receiverDelay is how long the receiver takes to answer, so that an
	// attempt is in flight when the kill comes.
	receiverDelay = 20 * time.Millisecond
	sinkID        = "killtest"
	tenant        = "acme"
)

func TestKillDuringDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("kill test: builds computed and runs real processes for about a minute")
	}
	timing := workers.DefaultTiming()
	dbURL := dbtest.URL(t)
	bin := proctest.Build(t, "computeplane/cmd/computed")
	dir := t.TempDir()
	sinkPath := filepath.Join(dir, "events.jsonl")

	rc := newReceiver(t, receiverDelay)
	caFile := filepath.Join(dir, "receiver-ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rc.srv.Certificate().Raw}), 0o600))

	sinkLease := workers.JobLease(sinks.JobName(sinks.NewFile(sinks.KindEvents, sinkID, sinkPath)))
	hookLease := workers.JobLease("webhooks")
	leaseNames := []string{sinkLease, hookLease}
	idA, idB := pickWorkerIDs(leaseNames)

	pool, err := pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	envOf := func(cfgFile, roles string, port int) []string {
		return proctest.ChildEnv(map[string]string{
			"SERVICE_DATABASE_URL": dbURL,
			"SERVICE_SECRET":       testenv.TestSecret,
			"SERVICE_CONFIG":       cfgFile,
			"SERVICE_ROLES":        roles,
			"HOST":                 "127.0.0.1",
			"PORT":                 strconv.Itoa(port),
			// The child processes trust the receiver's test certificate
			// (crypto/x509 reads SSL_CERT_FILE on Linux).
			"SSL_CERT_FILE": caFile,
		})
	}
	cfgA := writeConfig(t, dir, "a.yaml", idA, sinkPath)
	cfgB := writeConfig(t, dir, "b.yaml", idB, sinkPath)

	// A: api and sinks. It holds both jobs until B joins.
	portA := testenv.FreePort(t)
	a := proctest.Start(t, "A", bin, envOf(cfgA, "api,sinks", portA), "serve")
	addrA := net.JoinHostPort("127.0.0.1", strconv.Itoa(portA))
	a.WaitHealthy(t, addrA)

	// An API key minted as an operator does it.
	key := proctest.CreateKey(t, bin, envOf(cfgA, "api,sinks", portA), tenant, "killtest", "owner")
	c, err := computeclient.New("http://"+addrA+config.DefaultBasePath, computeclient.WithToken(key),
		computeclient.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}))
	require.NoError(t, err)

	// Events committed before the webhook are not delivered to it.
	before := outboxIDs(t, pool)
	hook, err := c.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{TenantId: tenant, URL: rc.URL(), Events: []string{"*"}})
	require.NoError(t, err)
	rc.setSecret(t, hook.Data.Secret)
	webhookID := hook.Data.Webhook.WebhookId

	// B: sinks only. It wins both jobs by rendezvous hashing; A releases
	// them at its next tick.
	b := proctest.Start(t, "B", bin, envOf(cfgB, "sinks", testenv.FreePort(t)), "serve")
	require.Eventually(t, func() bool {
		b.RequireRunning(t)
		held := leaseHolders(t, pool, leaseNames)
		return held[sinkLease].holder == idB && held[hookLease].holder == idB
	}, 3*timing.Renew+10*time.Second, 50*time.Millisecond, "B takes both dispatch leases")
	epochsBefore := leaseHolders(t, pool, leaseNames)

	// Events at a steady pace through A's API, before and after the kill.
	gen := startGenerator(t, c, numEvents, pace)

	// Kill B once killAfter events are in, while a webhook attempt of B is
	// in flight at the receiver and committed events wait behind the
	// sink's cursor (both dispatches under way); after a few seconds
	// without both, an attempt in flight is enough.
	require.Eventually(t, func() bool { return gen.created.Load() >= killAfter }, 60*time.Second, time.Millisecond)
	inFlightAtKill := int64(0)
	both := false
	for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait); time.Sleep(200 * time.Microsecond) {
		if inFlightAtKill = rc.inflight.Load(); inFlightAtKill > 0 && sinkLag(t, pool) > 0 {
			both = inFlightAtKill == rc.inflight.Load() // still in flight after the query
			if both {
				break
			}
		}
	}
	for wait := time.Now().Add(5 * time.Second); !both && time.Now().Before(wait); time.Sleep(200 * time.Microsecond) {
		if inFlightAtKill = rc.inflight.Load(); inFlightAtKill > 0 {
			break
		}
	}
	held := leaseHolders(t, pool, leaseNames)
	require.Equal(t, idB, held[sinkLease].holder, "B still holds the sink lease at the kill")
	require.Equal(t, idB, held[hookLease].holder, "B still holds the webhooks lease at the kill")
	require.NoError(t, b.Cmd.Process.Signal(syscall.SIGKILL))
	killedAt := time.Now()
	killedAtDB := dbNow(t, pool)
	eventsAtKill := gen.created.Load()
	sinkAtKill := readSink(t, sinkPath)
	hookAtKill := rc.snapshot()
	b.WaitExit(t, 5*time.Second)
	ws, ok := b.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "B died of SIGKILL: %v", b.Cmd.ProcessState)
	orphanedClaims := count(t, pool, `SELECT count(*) FROM webhook_deliveries
		WHERE state = 'pending' AND claimed_until > clock_timestamp()`)
	sinkLagAtKill := sinkLag(t, pool)
	t.Logf("kill: B (%s) killed with SIGKILL after %d events created; %d webhook attempt(s) in flight at the receiver; "+
		"%d claim(s) left by B; sink %d lines, %d rows behind; receiver %d requests; leases expire in %s / %s",
		idB, eventsAtKill, inFlightAtKill, orphanedClaims, sinkAtKill.lines, sinkLagAtKill, hookAtKill.requests,
		held[sinkLease].expiresAt.Sub(killedAtDB).Round(time.Millisecond), held[hookLease].expiresAt.Sub(killedAtDB).Round(time.Millisecond))
	assert.Positive(t, sinkAtKill.lines, "the sink was dispatching before the kill")
	assert.Positive(t, hookAtKill.requests, "webhook delivery was under way before the kill")

	// A takes both leases over, with a higher epoch. A killed worker's
	// leases expire at most a lease lifetime after its last renewal; A
	// looks at its next tick.
	takeoverBound := timing.LeaseTTL + timing.Renew + 2*time.Second
	takeover := map[string]time.Duration{}
	require.Eventually(t, func() bool {
		a.RequireRunning(t)
		now := leaseHolders(t, pool, leaseNames)
		for _, n := range leaseNames {
			if _, seen := takeover[n]; !seen && now[n].holder == idA {
				takeover[n] = now[n].acquiredAt.Sub(killedAtDB)
			}
		}
		return len(takeover) == len(leaseNames)
	}, takeoverBound+5*time.Second, 20*time.Millisecond, "A takes the leases over")
	t.Logf("takeover: sink lease after %s, webhooks lease after %s (kill to acquisition, database clock; bound %s)",
		takeover[sinkLease].Round(time.Millisecond), takeover[hookLease].Round(time.Millisecond), takeoverBound)
	for _, n := range leaseNames {
		assert.LessOrEqual(t, takeover[n], takeoverBound, "%s taken over within a lease lifetime and a tick", n)
	}

	gen.wait(t)

	// Everything reaches both, at least once. A killed process's webhook
	// claims come back after the claim TTL.
	deadline := killedAt.Add(timing.LeaseTTL + timing.Renew + webhooks.DefaultClaimTTL + 15*time.Second)
	var sinkDoneAt, hookDoneAt, recordedAt time.Duration
	var missingSink, missingHook []string
	var all, hookWanted []string
	for {
		all, hookWanted = expected(t, pool, before)
		sk := readSink(t, sinkPath)
		hk := rc.snapshot()
		missingSink, missingHook = missing(all, sk.byEvent), missing(hookWanted, hk.byEvent)
		if len(missingSink) == 0 && sinkDoneAt == 0 {
			sinkDoneAt = time.Since(killedAt)
		}
		if len(missingHook) == 0 && hookDoneAt == 0 {
			hookDoneAt = time.Since(killedAt)
		}
		unfinished := count(t, pool, "SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'")
		if unfinished == 0 && len(missingHook) == 0 && recordedAt == 0 {
			recordedAt = time.Since(killedAt)
		}
		if len(missingSink) == 0 && len(missingHook) == 0 && unfinished == 0 && sinkLag(t, pool) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("not everything arrived within %s of the kill: %d of %d events missing from the sink, %d of %d from the receiver, %d deliveries not delivered",
				deadline.Sub(killedAt), len(missingSink), len(all), len(missingHook), len(hookWanted), unfinished)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The count.
	sk := readSink(t, sinkPath)
	hk := rc.snapshot()
	assert.Len(t, all, numEvents+len(before), "one outbox event per site created, besides those before the webhook")
	assert.Len(t, hookWanted, numEvents, "the webhook gets every event of its tenant committed after its creation")
	assert.Empty(t, missingSink, "every outbox event is in the sink file")
	assert.Empty(t, missingHook, "every event reaches the webhook receiver")
	assert.Empty(t, missing(keys(sk.byEvent), setOf(all)), "the sink holds only outbox events")
	assert.Empty(t, missing(keys(hk.byEvent), setOf(hookWanted)), "the receiver got only the tenant's new events")
	assert.Zero(t, hk.badSignature, "every delivery verifies with the webhook's secret (Standard Webhooks)")
	assert.Zero(t, hk.badHeaders, "webhook-id and X-Service-Delivery carry the same delivery id")
	assert.Zero(t, count(t, pool, "SELECT count(*) FROM sink_dead_letters"), "no sink dead letters")
	assert.Equal(t, numEvents, count(t, pool, "SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1 AND state = 'delivered'", webhookID),
		"one delivered delivery per event")
	assert.Len(t, hk.byDelivery, numEvents, "one delivery id per event, the same across resends")

	after := leaseHolders(t, pool, leaseNames)
	for _, n := range leaseNames {
		assert.Equal(t, idA, after[n].holder, "%s held by the survivor", n)
		assert.Greater(t, after[n].epoch, epochsBefore[n].epoch, "%s epoch raised by the takeover", n)
		assert.True(t, after[n].active, "%s active", n)
	}

	t.Logf("events: %d in the outbox (%d before the webhook), %d created through the API (%d before the kill)",
		len(all), len(before), gen.created.Load(), eventsAtKill)
	t.Logf("sink: %d lines, %d distinct events, %d duplicate lines, %d unreadable (torn) lines; complete %s after the kill",
		sk.lines, len(sk.byEvent), sk.lines-sk.torn-len(sk.byEvent), sk.torn, sinkDoneAt.Round(time.Millisecond))
	t.Logf("webhook: %d requests, %d distinct events, %d distinct deliveries, %d duplicate requests (%d events received more than once); complete %s after the kill",
		hk.requests, len(hk.byEvent), len(hk.byDelivery), hk.requests-len(hk.byEvent), countOver(hk.byEvent, 1), hookDoneAt.Round(time.Millisecond))
	t.Logf("webhook deliveries: all %d recorded delivered %s after the kill (the new holder gives back the killed process's claims)",
		numEvents, recordedAt.Round(time.Millisecond))
	t.Logf("leases: %s epoch %d -> %d, %s epoch %d -> %d",
		sinkLease, epochsBefore[sinkLease].epoch, after[sinkLease].epoch, hookLease, epochsBefore[hookLease].epoch, after[hookLease].epoch)
	if t.Failed() {
		t.Logf("A stderr (tail):\n%s", proctest.Tail(a.Stderr.String(), 40))
		t.Logf("B stderr (tail):\n%s", proctest.Tail(b.Stderr.String(), 40))
	}

	// A still stops cleanly.
	assert.Equal(t, 0, a.Stop(t, 30*time.Second), "A exits 0 on SIGTERM")
}

// pickWorkerIDs returns worker ids for A and B such that B wins every
// lease by rendezvous hashing. weight mirrors internal/workers (lease.go):
// the first 8 bytes of SHA-256(worker, 0, lease), big-endian; the test
// checks that B did get the leases, so a change there fails loudly.
func pickWorkerIDs(leases []string) (a, b string) {
	weight := func(worker, lease string) uint64 {
		h := sha256.New()
		h.Write([]byte(worker))
		h.Write([]byte{0})
		h.Write([]byte(lease))
		return binary.BigEndian.Uint64(h.Sum(nil))
	}
	a = "killtest-a"
	for i := 0; ; i++ {
		b = fmt.Sprintf("killtest-b-%d", i)
		wins := true
		for _, l := range leases {
			wins = wins && weight(b, l) > weight(a, l)
		}
		if wins {
			return a, b
		}
	}
}

func writeConfig(t *testing.T, dir, name, workerID, sinkPath string) string {
	t.Helper()
	yaml := fmt.Sprintf(`notifier: {kind: postgres}
sinks:
  events:
    - {id: %s, kind: file, path: %q}
webhooks: {allowPrivateTargets: true}
workers: {id: %s}
log: {level: info}
`, sinkID, sinkPath, workerID)
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(yaml), 0o600))
	return p
}

// generator creates sites through the API at a steady pace.
type generator struct {
	created atomic.Int64
	done    chan struct{}
	errs    []error
}

func startGenerator(t *testing.T, c *computeclient.Client, n int, pace time.Duration) *generator {
	g := &generator{done: make(chan struct{})}
	ctx := t.Context()
	go func() {
		defer close(g.done)
		tick := time.NewTicker(pace)
		defer tick.Stop()
		for i := range n {
			_, err := c.SitesCreate(ctx, &client.SitesCreateInput{
				TenantId: tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu-west",
				IdempotencyKey: fmt.Sprintf("killtest-%d", i),
			})
			if err != nil {
				g.errs = append(g.errs, err)
				if len(g.errs) > 5 {
					return
				}
				continue
			}
			g.created.Add(1)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return g
}

func (g *generator) wait(t *testing.T) {
	t.Helper()
	select {
	case <-g.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the event generator did not finish")
	}
	require.Empty(t, g.errs, "sites.create failed")
}

// receiver is the https webhook receiver: it counts requests by event id
// (the body's CloudEvent id) and by delivery id (webhook-id), and checks
// signatures with the Standard Webhooks reference library.
type receiver struct {
	srv      *httptest.Server
	delay    time.Duration
	inflight atomic.Int64
	wh       atomic.Pointer[standardwebhooks.Webhook]

	mu           sync.Mutex
	requests     int
	byEvent      map[string]int
	byDelivery   map[string]int
	badSignature int
	badHeaders   int
}

func newReceiver(t *testing.T, delay time.Duration) *receiver {
	t.Helper()
	rc := &receiver{delay: delay, byEvent: map[string]int{}, byDelivery: map[string]int{}}
	rc.srv = httptest.NewTLSServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) URL() string { return rc.srv.URL + "/hook" }

func (rc *receiver) setSecret(t *testing.T, secret string) {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	rc.wh.Store(wh)
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	rc.inflight.Add(1)
	defer rc.inflight.Add(-1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "short body", http.StatusBadRequest)
		return
	}
	var ev struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &ev)
	delivery := r.Header.Get(webhooks.HeaderID)
	wh := rc.wh.Load()
	signed := wh != nil && wh.Verify(body, r.Header) == nil
	rc.mu.Lock()
	rc.requests++
	rc.byEvent[ev.ID]++
	rc.byDelivery[delivery]++
	if !signed {
		rc.badSignature++
	}
	if delivery == "" || r.Header.Get(webhooks.HeaderDelivery) != delivery {
		rc.badHeaders++
	}
	rc.mu.Unlock()
	select {
	case <-time.After(rc.delay):
	case <-r.Context().Done():
	}
	w.WriteHeader(http.StatusOK)
}

type received struct {
	requests, badSignature, badHeaders int
	byEvent, byDelivery                map[string]int
}

func (rc *receiver) snapshot() received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return received{
		requests: rc.requests, badSignature: rc.badSignature, badHeaders: rc.badHeaders,
		byEvent: clone(rc.byEvent), byDelivery: clone(rc.byDelivery),
	}
}

// sinkFile is what the file sink holds: lines by event id.
type sinkFile struct {
	lines, torn int
	byEvent     map[string]int
}

// readSink reads the sink's JSON Lines; a line that is not a CloudEvent
// with an id counts as torn (a process killed mid-write), except a last
// line still being written.
func readSink(t *testing.T, path string) sinkFile {
	t.Helper()
	out := sinkFile{byEvent: map[string]int{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return out
	}
	require.NoError(t, err)
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1] // a last line without its newline is being written
	} else {
		return out
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		out.lines++
		var ev struct {
			SpecVersion string `json:"specversion"`
			ID          string `json:"id"`
		}
		if json.Unmarshal(line, &ev) != nil || ev.ID == "" || ev.SpecVersion != "1.0" {
			out.torn++
			continue
		}
		out.byEvent[ev.ID]++
	}
	require.NoError(t, sc.Err())
	return out
}

type leaseRow struct {
	holder                string
	epoch                 int64
	acquiredAt, expiresAt time.Time
	active                bool
}

func leaseHolders(t *testing.T, pool *pgxpool.Pool, names []string) map[string]leaseRow {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT name, holder, epoch, acquired_at, expires_at, expires_at > clock_timestamp()
		FROM leases WHERE name = ANY($1)`, names)
	require.NoError(t, err)
	out := map[string]leaseRow{}
	for rows.Next() {
		var name string
		var l leaseRow
		require.NoError(t, rows.Scan(&name, &l.holder, &l.epoch, &l.acquiredAt, &l.expiresAt, &l.active))
		if l.active {
			out[name] = l
		} else {
			out[name] = leaseRow{epoch: l.epoch, acquiredAt: l.acquiredAt, expiresAt: l.expiresAt}
		}
	}
	require.NoError(t, rows.Err())
	return out
}

func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT clock_timestamp()").Scan(&now))
	return now
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), query, args...).Scan(&n))
	return n
}

// sinkLag is the number of outbox rows after the sink's durable cursor
// (every row while it has none).
func sinkLag(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM outbox o
		WHERE NOT EXISTS (SELECT 1 FROM sink_cursors c WHERE c.sink_kind = 'events' AND c.sink_id = $1
		                  AND (o.xid, o.seq) <= (c.after_xid, c.after_seq))`, sinkID)
}

func outboxIDs(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT id FROM outbox")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return setOf(ids)
}

// expected returns every outbox event id (for the sink) and those the
// webhook subscribes to: the tenant's, committed after its creation.
func expected(t *testing.T, pool *pgxpool.Pool, before map[string]bool) (all, hook []string) {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT id, tenant_id FROM outbox ORDER BY xid, seq")
	require.NoError(t, err)
	for rows.Next() {
		var id, tid string
		require.NoError(t, rows.Scan(&id, &tid))
		all = append(all, id)
		if tid == tenant && !before[id] {
			hook = append(hook, id)
		}
	}
	require.NoError(t, rows.Err())
	return all, hook
}

func missing[V comparable](want []string, got map[string]V) []string {
	var out []string
	var zero V
	for _, id := range want {
		if got[id] == zero {
			out = append(out, id)
		}
	}
	return out
}

func setOf(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func countOver(m map[string]int, n int) int {
	c := 0
	for _, v := range m {
		if v > n {
			c++
		}
	}
	return c
}

func clone(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
