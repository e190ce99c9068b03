package events_test

// GET /watch end to end over HTTP: through the real host (mounting, the
// gate's refusals, order, filters, resuming, revocation through the identity
// inbox) and through a Watch of its own where the test sets the timings
// (re-authentication, heartbeats, wake-ups, read timeouts, shutdown).

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/gen/client"
	"computeplane/internal/builtin"
	"computeplane/internal/config"
	"computeplane/internal/cursor"
	"computeplane/internal/dbtest"
	"computeplane/internal/events"
	"computeplane/internal/host"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/logging"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/testenv"
)

// message is one SSE message, or a comment line.
type message struct {
	id, event, data string
	comment         string
}

// stream reads an SSE response in the background.
type stream struct {
	resp *http.Response
	msgs chan message
}

func watchURL(base, tenant string, types ...string) string {
	q := url.Values{}
	if tenant != "" {
		q.Set("tenantId", tenant)
	}
	for _, t := range types {
		q.Add("types", t)
	}
	return base + "/watch?" + q.Encode()
}

func get(t *testing.T, u, token string, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

func open(t *testing.T, u, token string, header map[string]string) *stream {
	t.Helper()
	resp := get(t, u, token, header)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, body)
	}
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	require.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	s := &stream{resp: resp, msgs: make(chan message, 1000)}
	go func() {
		defer close(s.msgs)
		r := bufio.NewReader(resp.Body)
		var m message
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "":
				if m != (message{}) {
					s.msgs <- m
				}
				m = message{}
			case strings.HasPrefix(line, ":"):
				s.msgs <- message{comment: strings.TrimSpace(line[1:])}
			default:
				k, v, _ := strings.Cut(line, ": ")
				switch k {
				case "id":
					m.id = v
				case "event":
					m.event = v
				case "data":
					m.data = v
				}
			}
		}
	}()
	return s
}

// events reads the next n events, skipping comments.
func (s *stream) events(t *testing.T, n int) []message {
	t.Helper()
	var out []message
	timeout := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case m, ok := <-s.msgs:
			require.True(t, ok, "stream ended after %d of %d events", len(out), n)
			if m.comment == "" {
				out = append(out, m)
			}
		case <-timeout:
			t.Fatalf("got %d of %d events", len(out), n)
		}
	}
	return out
}

// comment waits for a comment containing text and fails on an event.
func (s *stream) comment(t *testing.T, text string, within time.Duration) {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case m, ok := <-s.msgs:
			require.True(t, ok, "stream ended before the comment %q", text)
			require.Empty(t, m.event, "an event where a comment was expected")
			if strings.Contains(m.comment, text) {
				return
			}
		case <-timeout:
			t.Fatalf("no comment %q within %s", text, within)
		}
	}
}

// ends waits until the server ends the stream and returns the comments it
// sent last.
func (s *stream) ends(t *testing.T, within time.Duration) []string {
	t.Helper()
	var comments []string
	timeout := time.After(within)
	for {
		select {
		case m, ok := <-s.msgs:
			if !ok {
				return comments
			}
			require.Empty(t, m.event, "an event where the end was expected")
			comments = append(comments, m.comment)
		case <-timeout:
			t.Fatalf("the stream did not end within %s", within)
		}
	}
}

// quiet checks that no event arrives for d.
func (s *stream) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case m, ok := <-s.msgs:
			require.True(t, ok, "stream ended")
			require.Empty(t, m.event, "unexpected event %+v", m)
		case <-timeout:
			return
		}
	}
}

func subjectsOfMessages(t *testing.T, ms []message) []string {
	t.Helper()
	var out []string
	for _, m := range ms {
		var e outbox.CloudEvent
		require.NoError(t, json.Unmarshal([]byte(m.data), &e), m.data)
		assert.Equal(t, e.Type, m.event, "event: names the type")
		out = append(out, e.Subject)
	}
	return out
}

type refusal struct {
	status int
	code   string
	header http.Header
}

func refused(t *testing.T, u, token string, header map[string]string) refusal {
	t.Helper()
	resp := get(t, u, token, header)
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return refusal{resp.StatusCode, body.Error.Code, resp.Header}
}

func TestWatchRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	u := watchURL(f.env.URL, "acme")

	r := refused(t, u, "", nil)
	assert.Equal(t, refusal{401, "UNAUTHENTICATED", r.header}, r)
	assert.Equal(t, "Bearer", r.header.Get("WWW-Authenticate"))
	assert.Equal(t, 401, refused(t, u, "cpk_wrong", nil).status)
	assert.Equal(t, "ACCESS_DENIED", refused(t, u, f.tokens["globex"], nil).code, "another tenant's stream")
	assert.Equal(t, 403, refused(t, u, f.tokens["globex"], nil).status)

	for name, tt := range map[string]struct {
		url    string
		header map[string]string
	}{
		"no tenant":          {watchURL(f.env.URL, ""), nil},
		"malformed tenant":   {watchURL(f.env.URL, "a b"), nil},
		"unknown family":     {watchURL(f.env.URL, "acme", "nope.*"), nil},
		"malformed pattern":  {watchURL(f.env.URL, "acme", "Site"), nil},
		"bad Last-Event-ID":  {u, map[string]string{"Last-Event-ID": "nope"}},
		"bad lastEventId":    {u + "&lastEventId=nope", nil},
		"tenant given twice": {u + "&tenantId=globex", nil},
	} {
		// Validation comes first: even without a credential.
		r := refused(t, tt.url, "", tt.header)
		assert.Equal(t, 400, r.status, name)
		assert.Equal(t, "INVALID_INPUT", r.code, name)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, u, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

func TestWatchStreamsFiltersAndResumes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	st := f.env.Store
	publish(t, st, "acme", api.EventSiteCreated, "before")
	publish(t, st, "globex", api.EventSiteCreated, "other-tenant")

	all := open(t, watchURL(f.env.URL, "acme"), f.tokens["acmeViewer"], nil)
	sites := open(t, watchURL(f.env.URL, "acme", "site.created,site.deleted", "security.secret.put"), f.tokens["acme"], nil)
	assert.Equal(t, []string{"before"}, subjectsOfMessages(t, all.events(t, 1)), "from the start without Last-Event-ID")

	publish(t, st, "acme", api.EventSiteUpdated, "u1")
	publish(t, st, "acme", api.EventSiteDeleted, "d1")
	publish(t, st, "globex", api.EventSiteDeleted, "g1")
	publish(t, st, "acme", api.EventSecuritySecretPut, "p1")
	publish(t, st, "acme", api.EventSecuritySecretDeleted, "x1")

	got := all.events(t, 4)
	assert.Equal(t, []string{"u1", "d1", "p1", "x1"}, subjectsOfMessages(t, got), "in order, the tenant's only")
	filtered := sites.events(t, 3)
	assert.Equal(t, []string{"before", "d1", "p1"}, subjectsOfMessages(t, filtered), "repeated and comma-separated patterns")
	assert.Equal(t, "site.created", filtered[0].event)

	// Resume after d1 with Last-Event-ID (or lastEventId): only what followed.
	resumed := open(t, watchURL(f.env.URL, "acme"), f.tokens["acme"], map[string]string{"Last-Event-ID": got[1].id})
	assert.Equal(t, []string{"p1", "x1"}, subjectsOfMessages(t, resumed.events(t, 2)))
	resumed.quiet(t, 700*time.Millisecond)
	byQuery := open(t, watchURL(f.env.URL, "acme")+"&lastEventId="+url.QueryEscape(got[2].id), f.tokens["acme"], nil)
	assert.Equal(t, []string{"x1"}, subjectsOfMessages(t, byQuery.events(t, 1)))

	// An id is an events.list cursor of the tenant, and only of the tenant.
	page, err := list(t, f.acme, client.EventsListInput{TenantId: "acme", Cursor: client.NewOptString(got[2].id)})
	require.NoError(t, err)
	assert.Equal(t, []string{"x1"}, subjectsOf(page))
	r := refused(t, watchURL(f.env.URL, "globex"), f.tokens["globex"], map[string]string{"Last-Event-ID": got[2].id})
	assert.Equal(t, "INVALID_INPUT", r.code)

	// A real mutation reaches the open stream.
	_, err = f.acme.SitesCreate(t.Context(), &client.SitesCreateInput{
		TenantId: "acme", Kind: client.SitesCreateInputKindCustom, Region: "eu-west", IdempotencyKey: "k1",
	})
	require.NoError(t, err)
	m := sites.events(t, 1)[0]
	assert.Equal(t, "site.created", m.event)
}

// hostEnv is the api role assembled by the test, with the identity inbox
// drained into the caches as Serve does, so revocations arrive through the
// real path: identity service -> inbox -> Cached.React -> streams.
func hostEnv(t *testing.T) (*testenv.Env, *host.Host) {
	t.Helper()
	st := dbtest.NewStore(t)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"SERVICE_DATABASE_URL": "postgres://unused", "SERVICE_SECRET": testenv.TestSecret}[k]
	})
	require.NoError(t, err)
	log := logging.New(io.Discard, slog.LevelDebug)
	h, err := host.Assemble(cfg, st, log, builtin.All(), host.Overrides{})
	require.NoError(t, err)
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		iam.DrainInbox(ctx, h.Identity(), h.Caches().React, 20*time.Millisecond, log)
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return &testenv.Env{URL: srv.URL, APIURL: srv.URL + cfg.BasePath, Config: cfg, Store: st}, h
}

func TestWatchClosesWhenTheCredentialIsRevoked(t *testing.T) {
	t.Parallel()
	env, _ := hostEnv(t)
	token, keyID := env.NewKey(t, "acme", "ann", "owner")
	other := env.Key(t, "acme", "bob", "owner")
	s := open(t, watchURL(env.URL, "acme"), token, nil)
	kept := open(t, watchURL(env.URL, "acme"), other, nil)
	publish(t, env.Store, "acme", api.EventSiteCreated, "a1")
	s.events(t, 1)
	kept.events(t, 1)

	start := time.Now()
	env.RevokeKey(t, keyID)
	comments := s.ends(t, 5*time.Second)
	assert.Less(t, time.Since(start), iam.CredentialTTL/2, "long before the credential cache would expire")
	assert.Contains(t, comments, "closed: the credential was revoked")
	kept.quiet(t, 300*time.Millisecond)

	// Reconnecting with the revoked key is refused.
	assert.Equal(t, 401, refused(t, watchURL(env.URL, "acme"), token, nil).status)
	// The other session's stream is still open and live.
	publish(t, env.Store, "acme", api.EventSiteCreated, "a2")
	assert.Equal(t, []string{"a2"}, subjectsOfMessages(t, kept.events(t, 1)))
}

// clock is a settable clock for the identity caches.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// own is a Watch of the test's own, on the real store, identity service,
// caches and gate.
type own struct {
	st       *store.Store
	identity *embedded.Service
	cached   *iam.Cached
	clk      *clock
	watch    *events.Watch
	url      string
}

func newOwn(t *testing.T, edit func(*events.Watch), serverEdit func(*http.Server)) *own {
	t.Helper()
	st := dbtest.NewStore(t)
	clk := &clock{t: time.Now()}
	identity := embedded.New(st, "root", "compute-", nil)
	cached := iam.NewCached(identity, clk.now)
	w := &events.Watch{
		Gate:        &iam.Gate{Port: cached, TypePrefix: "compute-"},
		Store:       st,
		Cursors:     cursor.New(testenv.TestSecret),
		Revocations: cached,
		Poll:        20 * time.Millisecond,
	}
	if edit != nil {
		edit(w)
	}
	srv := httptest.NewUnstartedServer(w)
	if serverEdit != nil {
		serverEdit(srv.Config)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return &own{st: st, identity: identity, cached: cached, clk: clk, watch: w, url: srv.URL}
}

func (o *own) key(t *testing.T, tenant, identity string) (token, keyID string) {
	t.Helper()
	token, keyID, err := o.identity.CreateKey(t.Context(), embedded.KeyRequest{Tenant: tenant, Identity: identity, Role: "viewer"})
	require.NoError(t, err)
	return token, keyID
}

// The credential cache keeps a revoked key valid for up to 30 s; a stream
// re-authenticates every Reauth and ends once the cached entry expired and
// the identity service refuses the key, even without a revocation event.
func TestWatchClosesWhenReauthenticationFails(t *testing.T) {
	t.Parallel()
	o := newOwn(t, func(w *events.Watch) { w.Reauth = 50 * time.Millisecond }, nil)
	token, keyID := o.key(t, "acme", "ann")
	s := open(t, watchURL(o.url, "acme"), token, nil)
	require.NoError(t, o.identity.RevokeKey(t.Context(), keyID)) // no React: the inbox is not drained here
	s.quiet(t, 300*time.Millisecond)                             // re-authenticated from the cache, several times

	o.clk.add(iam.CredentialTTL)
	comments := s.ends(t, 5*time.Second)
	assert.Contains(t, comments, "closed: re-authentication failed")
}

// A revocation reaches the streams of that session only, through the
// caches' listeners.
func TestWatchClosesOnReact(t *testing.T) {
	t.Parallel()
	o := newOwn(t, nil, nil)
	token, keyID := o.key(t, "acme", "ann")
	other, _ := o.key(t, "acme", "bob")
	s := open(t, watchURL(o.url, "acme"), token, nil)
	kept := open(t, watchURL(o.url, "acme"), other, nil)
	s.comment(t, "connected", 5*time.Second)
	kept.comment(t, "connected", 5*time.Second)
	o.cached.React(iam.Event{Type: embedded.EventCredentialRevoked, IdentityID: "ann", Session: "key:" + keyID})
	assert.Contains(t, s.ends(t, 5*time.Second), "closed: the credential was revoked")
	kept.quiet(t, 200*time.Millisecond)
}

func TestWatchHeartbeats(t *testing.T) {
	t.Parallel()
	o := newOwn(t, func(w *events.Watch) { w.Heartbeat = 30 * time.Millisecond }, nil)
	token, _ := o.key(t, "acme", "ann")
	s := open(t, watchURL(o.url, "acme"), token, nil)
	s.comment(t, "connected", 5*time.Second)
	s.comment(t, "heartbeat", 5*time.Second)
	s.comment(t, "heartbeat", 5*time.Second)
}

// A wake-up makes the stream read at once instead of at its next poll.
func TestWatchWakesEarly(t *testing.T) {
	t.Parallel()
	wake := make(chan struct{}, 1)
	var subscribed, stopped sync.WaitGroup
	subscribed.Add(1)
	stopped.Add(1)
	o := newOwn(t, func(w *events.Watch) {
		w.Poll = time.Hour
		w.Wake = func() (<-chan struct{}, func()) {
			subscribed.Done()
			return wake, stopped.Done
		}
	}, nil)
	token, _ := o.key(t, "acme", "ann")
	s := open(t, watchURL(o.url, "acme"), token, nil)
	subscribed.Wait()
	s.comment(t, "connected", 5*time.Second)
	// "connected" comes before the stream's first read: let that read pass
	// so the event below can only be read because of the wake-up.
	s.quiet(t, 300*time.Millisecond)
	publish(t, o.st, "acme", api.EventSiteCreated, "a1")
	s.quiet(t, 200*time.Millisecond) // no poll for an hour
	wake <- struct{}{}
	assert.Equal(t, []string{"a1"}, subjectsOfMessages(t, s.events(t, 1)))
	_ = s.resp.Body.Close()
	stopped.Wait() // the subscription ends with the stream
}

// The server's read timeout does not end a stream.
func TestWatchOutlivesTheReadTimeout(t *testing.T) {
	t.Parallel()
	o := newOwn(t, nil, func(s *http.Server) { s.ReadTimeout = 100 * time.Millisecond })
	token, _ := o.key(t, "acme", "ann")
	s := open(t, watchURL(o.url, "acme"), token, nil)
	s.quiet(t, 400*time.Millisecond)
	publish(t, o.st, "acme", api.EventSiteCreated, "late")
	assert.Equal(t, []string{"late"}, subjectsOfMessages(t, s.events(t, 1)))
}

func TestWatchCloseEndsStreams(t *testing.T) {
	t.Parallel()
	o := newOwn(t, nil, nil)
	token, _ := o.key(t, "acme", "ann")
	s := open(t, watchURL(o.url, "acme"), token, nil)
	s.comment(t, "connected", 5*time.Second)
	o.watch.Close()
	assert.Contains(t, s.ends(t, 5*time.Second), "closed: the server is shutting down")
}
