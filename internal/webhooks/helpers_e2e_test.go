package webhooks_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/outbox"
	"computeplane/internal/testenv"
	"computeplane/internal/webhooks"
)

type fixture struct {
	env                       *testenv.Env
	root, acme, acme2, viewer *computeclient.Client
	globex                    *computeclient.Client
}

// setup starts the api role with the given webhooks options (YAML flow
// mapping such as "{allowPrivateTargets: true}"; "" for the defaults).
func setup(t *testing.T, webhooksOptions string) *fixture {
	t.Helper()
	var opts []testenv.Option
	if webhooksOptions != "" {
		opts = append(opts, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, "webhooks: "+webhooksOptions+"\n")))
	}
	env := testenv.Start(t, opts...)
	c := func(tenant, identity, role string) *computeclient.Client {
		return env.Client(t, computeclient.WithToken(env.Key(t, tenant, identity, role)))
	}
	return &fixture{
		env:    env,
		root:   c("root", "ops", "admin"),
		acme:   c("acme", "mia", "member"),
		acme2:  c("acme", "max", "member"),
		viewer: c("acme", "vic", "viewer"),
		globex: c("globex", "gus", "owner"),
	}
}

func code(t *testing.T, err error) string {
	t.Helper()
	return testenv.APIError(t, err).Code
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.env.Store.Pool().QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

func create(t *testing.T, c *computeclient.Client, tenant, url string, events ...string) (*client.WebhookWithSecret, error) {
	t.Helper()
	res, err := c.WebhooksCreate(t.Context(), &client.WebhooksCreateInput{TenantId: tenant, URL: url, Events: events})
	if err != nil {
		return nil, err
	}
	return &res.Data, nil
}

func mustCreate(t *testing.T, c *computeclient.Client, tenant, url string, events ...string) *client.WebhookWithSecret {
	t.Helper()
	w, err := create(t, c, tenant, url, events...)
	require.NoError(t, err)
	return w
}

func update(t *testing.T, c *computeclient.Client, in client.WebhooksUpdateInput) (*client.Webhook, error) {
	t.Helper()
	res, err := c.WebhooksUpdate(t.Context(), &in)
	if err != nil {
		return nil, err
	}
	return &res.Data, nil
}

func deliveries(t *testing.T, c *computeclient.Client, tenant, webhookID string) []client.Delivery {
	t.Helper()
	res, err := c.WebhooksDeliveries(t.Context(), &client.WebhooksDeliveriesInput{TenantId: tenant, WebhookId: webhookID, Limit: client.NewOptInt64(200)})
	require.NoError(t, err)
	return res.Data.Items
}

func delivery(t *testing.T, c *computeclient.Client, tenant, webhookID, deliveryID string) client.Delivery {
	t.Helper()
	for _, d := range deliveries(t, c, tenant, webhookID) {
		if d.DeliveryId == deliveryID {
			return d
		}
	}
	t.Fatalf("delivery %s of %s not listed", deliveryID, webhookID)
	return client.Delivery{}
}

var siteSeq atomic.Int64

// publish commits a site.created event of tenant through the API.
func publishSite(t *testing.T, c *computeclient.Client, tenant string) string {
	t.Helper()
	res, err := c.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: tenant, Kind: client.SitesCreateInputKindCustom, Region: "eu-west",
		IdempotencyKey: fmt.Sprintf("k%d", siteSeq.Add(1)),
	})
	require.NoError(t, err)
	return res.Data.SiteId
}

// publish commits one event of any catalog type for tenant in its own
// transaction and returns its id.
func (f *fixture) publish(t *testing.T, tenant, typ, subject string) string {
	t.Helper()
	var id string
	require.NoError(t, f.env.Store.WithTx(context.Background(), false, func(ctx context.Context, tx pgx.Tx) error {
		if err := outbox.Write(ctx, tx, outbox.Event{Type: typ, Subject: subject, TenantID: tenant, Data: map[string]string{"subject": subject}}); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT id FROM outbox WHERE subject = $1 ORDER BY seq DESC LIMIT 1", subject).Scan(&id)
	}))
	return id
}

// clock is the engine's clock: the real time plus an offset tests move
// forward, so it is never behind the API's clock.
type clock struct{ offset atomic.Int64 }

func (c *clock) Now() time.Time            { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) Advance(d time.Duration)   { c.offset.Add(int64(d)) }
func (c *clock) Offset() time.Duration     { return time.Duration(c.offset.Load()) }
func (c *clock) Since(t time.Time) float64 { return c.Now().Sub(t).Seconds() }

// engine builds a delivery engine on the fixture's database, trusting the
// test receivers' certificate.
func (f *fixture) engine(t *testing.T, clk *clock, eo webhooks.EngineOptions) *webhooks.Engine {
	t.Helper()
	o := webhooks.OptionsFrom(f.env.Config)
	if clk != nil {
		o.Now = clk.Now
	}
	roots := x509.NewCertPool()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	roots.AddCert(srv.Certificate()) // every httptest TLS server shares it
	srv.Close()
	eo.RootCAs = roots
	e, err := webhooks.NewEngine(f.env.Store, o, eo)
	require.NoError(t, err)
	t.Cleanup(e.Wait)
	return e
}

// fanOut runs FanOut until it has read every outbox row committed so far
// (transactions of other tests' databases on the cluster can hold the
// outbox's horizon back for a moment).
func (f *fixture) fanOut(t *testing.T, e *webhooks.Engine) {
	t.Helper()
	var lastXid string
	var lastSeq int64
	err := f.env.Store.Pool().QueryRow(context.Background(), "SELECT xid::text, seq FROM outbox ORDER BY xid DESC, seq DESC LIMIT 1").Scan(&lastXid, &lastSeq)
	if err == pgx.ErrNoRows {
		return
	}
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := e.FanOut(context.Background(), nil, 100)
		require.NoError(t, err)
		return f.count(t, "SELECT count(*) FROM webhook_fanout WHERE (after_xid, after_seq) >= ($1::text::xid8, $2::bigint)", lastXid, lastSeq) == 1
	}, 30*time.Second, 5*time.Millisecond, "fan-out caught up")
}

// deliver runs Deliver and waits for its attempts, again until nothing
// more is due (a webhook has at most two attempts in flight, so a call
// takes two of its deliveries at most); it returns how many it started.
func deliver(t *testing.T, e *webhooks.Engine) int {
	t.Helper()
	total := 0
	for {
		n, err := e.Deliver(context.Background(), nil, 100)
		require.NoError(t, err)
		e.Wait()
		if n == 0 {
			return total
		}
		total += n
	}
}

// pump fans out what is committed and delivers what is due.
func (f *fixture) pump(t *testing.T, e *webhooks.Engine) int {
	t.Helper()
	f.fanOut(t, e)
	return deliver(t, e)
}

// received is one request a receiver got.
type received struct {
	header http.Header
	body   []byte
	at     time.Time
}

// receiver is an https endpoint that records what it gets and answers
// with its handler (200 by default).
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []received
	answer func(w http.ResponseWriter, r *http.Request)
	notify chan received
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{notify: make(chan received, 1024)}
	rc.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got := received{header: r.Header.Clone(), body: body, at: time.Now()}
		rc.mu.Lock()
		rc.got = append(rc.got, got)
		answer := rc.answer
		rc.mu.Unlock()
		select {
		case rc.notify <- got:
		default:
		}
		if answer != nil {
			answer(w, r)
		}
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) URL() string { return rc.srv.URL + "/hook" }

func (rc *receiver) respond(fn func(w http.ResponseWriter, r *http.Request)) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.answer = fn
}

func (rc *receiver) status(code int) {
	rc.respond(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) })
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}
