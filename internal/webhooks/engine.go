package webhooks

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/ids"
	"computeplane/internal/metrics"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/workers"
)

// Fence is called first in each transaction the engine writes in; an
// error aborts the transaction. A worker passes the check of its lease
// epoch, so a process that lost its lease cannot write; nil checks
// nothing.
type Fence func(ctx context.Context, tx pgx.Tx) error

// Engine defaults.
const (
	DefaultConcurrency = 64
	DefaultPerWebhook  = 2
	DefaultTimeout     = 15 * time.Second
	DefaultClaimTTL    = 30 * time.Second
	DefaultBatch       = 100
	// maxResponseBody is read from an answer (and dropped) so the
	// connection can be reused.
	maxResponseBody = 64 << 10
	userAgent       = "computeplane-webhooks/1"
)

// EngineOptions tune delivery. Zero values take the defaults.
type EngineOptions struct {
	// Concurrency bounds the attempts in flight in this process.
	Concurrency int
	// PerWebhook bounds the attempts in flight per webhook across every
	// process, so one slow or hanging receiver holds at most that many
	// places and never delays other webhooks.
	PerWebhook int
	// Timeout bounds each attempt (15 s).
	Timeout time.Duration
	// ClaimTTL is how long a claim lasts; a killed process's claims come
	// back when it passes. It must exceed Timeout.
	ClaimTTL time.Duration
	// Batch is how many outbox rows FanOut reads and how many deliveries
	// Deliver claims per call in Run.
	Batch int
	// Resolve looks receiver names up (nil: the system resolver).
	Resolve Resolver
	// RootCAs verify receivers' certificates (nil: the system roots).
	RootCAs *x509.CertPool
	// Rand draws the jitter of retries in [0, 1) (nil: math/rand/v2).
	Rand func() float64
	// Metrics registers the engine's metrics (nil: none).
	Metrics *metrics.Registry
	// Log receives the engine's failures (nil: slog.Default()).
	Log *slog.Logger
}

// Engine delivers webhooks: FanOut queues deliveries from the outbox,
// Deliver claims and sends them, Run alternates both. Deliver returns as
// soon as its attempts are started; Wait waits for them.
type Engine struct {
	store   *store.Store
	opt     Options
	eo      EngineOptions
	seal    *sealer
	now     func() time.Time
	rand    func() float64
	client  *http.Client
	log     *slog.Logger
	metrics *engineMetrics

	mu    sync.Mutex // serializes Deliver's claims against the free places
	slots chan struct{}
	wg    sync.WaitGroup
	freed chan struct{}
	// heldBack is set by FanOut when committed rows wait behind an older
	// transaction still running; Run then looks again within milliseconds
	// rather than at the next poll.
	heldBack atomic.Bool
}

// NewEngine returns the delivery engine of a deployment on st.
func NewEngine(st *store.Store, o Options, eo EngineOptions) (*Engine, error) {
	if eo.Concurrency <= 0 {
		eo.Concurrency = DefaultConcurrency
	}
	if eo.PerWebhook <= 0 {
		eo.PerWebhook = DefaultPerWebhook
	}
	if eo.Timeout <= 0 {
		eo.Timeout = DefaultTimeout
	}
	if eo.ClaimTTL <= 0 {
		eo.ClaimTTL = DefaultClaimTTL
	}
	if eo.ClaimTTL <= eo.Timeout {
		return nil, fmt.Errorf("webhooks: the claim TTL (%s) must exceed the attempt timeout (%s)", eo.ClaimTTL, eo.Timeout)
	}
	if eo.Batch <= 0 {
		eo.Batch = DefaultBatch
	}
	if eo.Rand == nil {
		eo.Rand = rand.Float64
	}
	log := eo.Log
	if log == nil {
		log = slog.Default()
	}
	m, err := newEngineMetrics(eo.Metrics)
	if err != nil {
		return nil, err
	}
	g := guard{allowPrivate: o.AllowPrivateTargets}
	return &Engine{
		store: st, opt: o, eo: eo, seal: newSealer(o.Key), now: o.clock(), rand: eo.Rand,
		client: newClient(g, eo.Resolve, eo.RootCAs), log: log.With("component", "webhooks"), metrics: m,
		slots: make(chan struct{}, eo.Concurrency), freed: make(chan struct{}, 1),
	}, nil
}

// tx runs fn in a transaction, after the fence when there is one.
func (e *Engine) tx(ctx context.Context, fence Fence, fn func(q *db.Queries) error) error {
	return e.txLater(ctx, fence, func(q, _ *db.Queries) error { return fn(q) })
}

// txLater is tx that also gives fn the queries whose writes are held
// for the transaction's next statement or its COMMIT (store.Later).
func (e *Engine) txLater(ctx context.Context, fence Fence, fn func(q, later *db.Queries) error) error {
	return e.store.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		if fence != nil {
			if err := fence(ctx, tx); err != nil {
				return err
			}
		}
		return fn(db.New(tx), db.New(store.Later(tx)))
	})
}

// fanoutRow is an outbox row of a fan-out's batch with the active
// webhooks of its tenant (FanoutBatch's JSON).
type fanoutRow struct {
	outbox.Row
	hooks []byte
}

// FanOut reads up to limit committed outbox rows after its durable cursor
// and queues, in the same transaction that moves the cursor, one pending
// delivery due now per active webhook of the event's tenant whose patterns
// match and that the event committed after (see the package doc). It
// returns the number of outbox rows read: fewer than limit means caught
// up. Concurrent calls take turns (the second reads nothing).
func (e *Engine) FanOut(ctx context.Context, fence Fence, limit int) (int, error) {
	if limit <= 0 {
		limit = e.eo.Batch
	}
	read := 0
	var queued int64
	err := e.txLater(ctx, fence, func(q, later *db.Queries) error {
		// One statement: the place (locked), the rows after it, their
		// tenants' active webhooks and whether rows wait behind it.
		batch, err := q.FanoutBatch(ctx, int32(limit))
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			return nil // another fan-out is at work
		}
		var rows []fanoutRow
		for _, b := range batch {
			if b.Seq.Valid {
				rows = append(rows, fanoutRow{Row: outbox.Row{Position: outbox.Position{Xid: b.Xid, Seq: b.Seq.Int64},
					Event: outbox.Envelope(db.ListOutboxCommittedRow{Seq: b.Seq.Int64, Xid: b.Xid, ID: b.ID.String, Type: b.Type.String,
						Source: b.Source.String, Subject: b.Subject.String, TenantID: b.TenantID.String, Time: *b.Time, Data: b.Data})},
					hooks: b.Hooks})
			}
		}
		// Fewer rows than limit: committed rows the reader may not take
		// yet (an older transaction still runs) make Run look again soon;
		// a full page: more to read.
		e.heldBack.Store(len(rows) == limit || batch[0].Held)
		if len(rows) == 0 {
			return nil
		}
		type hook struct {
			id     string
			events []string
			since  snapshot
		}
		byTenant := map[string][]hook{}
		for _, r := range rows {
			if _, ok := byTenant[r.Event.TenantID]; ok {
				continue
			}
			var hs []struct {
				ID     string   `json:"id"`
				Events []string `json:"events"`
				Since  string   `json:"since"`
			}
			if err := json.Unmarshal(r.hooks, &hs); err != nil {
				return err
			}
			byTenant[r.Event.TenantID] = []hook{}
			for _, h := range hs {
				sn, err := parseSnapshot(h.Since)
				if err != nil {
					return err
				}
				byTenant[r.Event.TenantID] = append(byTenant[r.Event.TenantID], hook{id: h.ID, events: h.Events, since: sn})
			}
		}
		now := e.now()
		var p db.InsertFanoutDeliveriesParams
		for _, r := range rows {
			matching := byTenant[r.Event.TenantID]
			if len(matching) == 0 {
				continue
			}
			xid, err := strconv.ParseUint(r.Position.Xid, 10, 64)
			if err != nil {
				return fmt.Errorf("webhooks: outbox xid %q: %w", r.Position.Xid, err)
			}
			var body []byte
			for _, h := range matching {
				if h.since.visible(xid) || !MatchAny(h.events, r.Event.Type) {
					continue
				}
				if body == nil {
					if body, err = json.Marshal(r.Event); err != nil {
						return err
					}
				}
				t, err := time.Parse(time.RFC3339Nano, r.Event.Time)
				if err != nil {
					return err
				}
				p.DeliveryIds = append(p.DeliveryIds, ids.New(deliveryPrefix))
				p.WebhookIds = append(p.WebhookIds, h.id)
				p.TenantIds = append(p.TenantIds, r.Event.TenantID)
				p.EventIds = append(p.EventIds, r.Event.ID)
				p.EventTypes = append(p.EventTypes, r.Event.Type)
				p.EventTimes = append(p.EventTimes, t)
				p.Bodies = append(p.Bodies, body)
			}
		}
		if len(p.DeliveryIds) > 0 {
			p.Now = now
			if queued, err = q.InsertFanoutDeliveries(ctx, p); err != nil {
				return err
			}
		}
		// The place moves with the COMMIT.
		last := rows[len(rows)-1].Position
		if err := later.MoveWebhookFanout(ctx, db.MoveWebhookFanoutParams{AfterXid: last.Xid, AfterSeq: last.Seq}); err != nil {
			return err
		}
		read = len(rows)
		return nil
	})
	if err != nil {
		return 0, err
	}
	e.metrics.queued(queued)
	return read, nil
}

// claimed is one delivery claimed for an attempt, with what sending needs.
type claimed struct {
	d     db.WebhookDelivery
	url   string
	keys  [][]byte
	token string
	err   error // the secrets did not open: recorded as a failed attempt
}

// Deliver claims up to limit due deliveries (fewer when this process has
// fewer free places, or their webhooks are at their in-flight limit) and
// starts their attempts, without waiting for them. It returns the number
// started. Pending deliveries of paused webhooks found on the way are
// cancelled.
func (e *Engine) Deliver(ctx context.Context, fence Fence, limit int) (int, error) {
	if limit <= 0 {
		limit = e.eo.Batch
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	n := min(limit, cap(e.slots)-len(e.slots))
	if n <= 0 {
		return 0, nil
	}
	cs, err := e.claim(ctx, fence, n)
	if err != nil {
		return 0, err
	}
	for _, c := range cs {
		e.slots <- struct{}{} // never blocks: at most n were claimed
		e.wg.Add(1)
		e.metrics.running(1)
		go e.attempt(ctx, fence, c)
	}
	return len(cs), nil
}

// Wait waits for every attempt started so far.
func (e *Engine) Wait() { e.wg.Wait() }

func (e *Engine) claim(ctx context.Context, fence Fence, n int) ([]claimed, error) {
	now := e.now()
	token := ids.New("clm")
	var out []claimed
	var cancelled int64
	err := e.tx(ctx, fence, func(q *db.Queries) error {
		out, cancelled = nil, 0
		due, err := q.DueWebhooks(ctx, db.DueWebhooksParams{Now: now, PerWebhook: int64(e.eo.PerWebhook), MaxRows: int32(n)})
		if err != nil || len(due) == 0 {
			return err
		}
		locked, err := q.LockClaimWebhooks(ctx, due)
		if err != nil {
			return err
		}
		hooks := map[string]db.Webhook{}
		var paused, active []string
		for _, w := range locked {
			hooks[w.WebhookID] = w
			if w.Active {
				active = append(active, w.WebhookID)
			} else {
				paused = append(paused, w.WebhookID)
			}
		}
		if len(paused) > 0 {
			if cancelled, err = q.CancelUnclaimedDeliveries(ctx, db.CancelUnclaimedDeliveriesParams{WebhookIds: paused, Now: now}); err != nil {
				return err
			}
		}
		if len(active) == 0 {
			return nil
		}
		counts, err := q.InflightCounts(ctx, db.InflightCountsParams{WebhookIds: active, Now: now})
		if err != nil {
			return err
		}
		free := map[string]int{}
		for _, id := range active {
			free[id] = e.eo.PerWebhook
		}
		for _, c := range counts {
			free[c.WebhookID] -= int(c.Inflight)
		}
		// Share the places round-robin in due order, so every webhook with
		// due work gets its turn before any gets a second one.
		share := map[string]int{}
		for left := n; left > 0; {
			given := 0
			for _, id := range due {
				if left == 0 {
					break
				}
				if _, ok := hooks[id]; !ok || !hooks[id].Active || share[id] >= free[id] {
					continue
				}
				share[id]++
				left--
				given++
			}
			if given == 0 {
				break
			}
		}
		var p db.ClaimDeliveriesParams
		for _, id := range due {
			if share[id] > 0 {
				p.WebhookIds = append(p.WebhookIds, id)
				p.Counts = append(p.Counts, int32(share[id]))
			}
		}
		if len(p.WebhookIds) == 0 {
			return nil
		}
		p.Now, p.ClaimedUntil, p.ClaimToken = now, now.Add(e.eo.ClaimTTL), token
		rows, err := q.ClaimDeliveries(ctx, p)
		if err != nil {
			return err
		}
		for _, d := range rows {
			w := hooks[d.WebhookID]
			keys, kerr := e.signingKeys(w, now)
			out = append(out, claimed{d: d, url: w.Url, keys: keys, token: token, err: kerr})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	e.metrics.cancelled(cancelled)
	return out, nil
}

// signingKeys opens the secrets that sign now: the current one, and the
// previous one until its overlap ends.
func (e *Engine) signingKeys(w db.Webhook, now time.Time) ([][]byte, error) {
	cur, err := e.seal.open(w.WebhookID, w.SecretGen, w.SecretNonce, w.SecretSealed)
	if err != nil {
		return nil, err
	}
	keys := [][]byte{cur}
	if w.PreviousGen.Valid && w.PreviousExpiresAt != nil && now.Before(*w.PreviousExpiresAt) {
		// A previous secret that does not open (sealed under an older
		// service secret) does not stop the current one from signing.
		if prev, err := e.seal.open(w.WebhookID, w.PreviousGen.Int64, w.PreviousNonce, w.PreviousSealed); err == nil {
			keys = append(keys, prev)
		}
	}
	return keys, nil
}

func (e *Engine) attempt(ctx context.Context, fence Fence, c claimed) {
	defer func() {
		<-e.slots
		e.metrics.running(-1)
		e.wg.Done()
		select {
		case e.freed <- struct{}{}:
		default:
		}
	}()
	start := time.Now()
	res := result{err: c.err}
	if res.err == nil {
		actx, cancel := context.WithTimeout(ctx, e.eo.Timeout)
		res = e.send(actx, c)
		cancel()
	}
	took := time.Since(start)
	// The results are written even when ctx ends (shutdown), briefly.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ctx.Err() != nil && res.err != nil {
		// Stopped mid-attempt: give the claim back, count nothing.
		err := e.tx(wctx, fence, func(q *db.Queries) error {
			_, err := q.ReleaseDelivery(wctx, db.ReleaseDeliveryParams{DeliveryID: c.d.DeliveryID, ClaimToken: c.token, Now: e.now()})
			return err
		})
		if err != nil {
			e.log.Warn("webhook claim not released; it expires", "deliveryId", c.d.DeliveryID, "error", err.Error())
		}
		e.metrics.attempt(OutcomeReleased, took)
		return
	}
	if res.err != nil && errors.Is(res.err, context.DeadlineExceeded) {
		res.err = fmt.Errorf("no answer within %s", e.eo.Timeout)
	}
	now := e.now()
	dec := decide(res, int(c.d.Attempts)+1, now, e.rand())
	recorded := false
	err := e.tx(wctx, fence, func(q *db.Queries) error {
		recorded = false
		if dec.outcome == OutcomeGone {
			// The webhook first, as every writer of both does.
			if _, err := q.GetWebhookForUpdate(wctx, c.d.WebhookID); errors.Is(err, pgx.ErrNoRows) {
				return nil // deleted meanwhile
			} else if err != nil {
				return err
			}
		}
		p := db.FinishDeliveryParams{DeliveryID: c.d.DeliveryID, ClaimToken: c.token, State: dec.state, NextAttemptAt: dec.next, Now: now}
		if res.err != nil {
			p.LastError = pgtype.Text{String: describe(res.err), Valid: true}
		} else {
			p.LastStatus = pgtype.Int4{Int32: int32(res.status), Valid: true}
		}
		n, err := q.FinishDelivery(wctx, p)
		if err != nil || n == 0 {
			return err // a lost claim records nothing
		}
		recorded = true
		if dec.outcome == OutcomeGone {
			if err := q.PauseWebhook(wctx, db.PauseWebhookParams{WebhookID: c.d.WebhookID, Now: now}); err != nil {
				return err
			}
			_, err := q.CancelPendingDeliveries(wctx, db.CancelPendingDeliveriesParams{WebhookID: c.d.WebhookID, Now: now})
			return err
		}
		return nil
	})
	if err != nil {
		e.log.Warn("webhook attempt not recorded; its claim expires and it is sent again",
			"deliveryId", c.d.DeliveryID, "error", err.Error())
		return
	}
	if !recorded {
		return
	}
	e.metrics.attempt(dec.outcome, took)
	if dec.outcome == OutcomeDelivered {
		e.metrics.delivered(now.Sub(c.d.EventTime))
	}
}

// send makes one attempt: a POST of the stored body, signed.
func (e *Engine) send(ctx context.Context, c claimed) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(c.d.Body))
	if err != nil {
		return result{err: err}
	}
	ts := e.now()
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", userAgent)
	h.Set(HeaderID, c.d.DeliveryID)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, Sign(c.keys, c.d.DeliveryID, ts, c.d.Body))
	h.Set(HeaderDelivery, c.d.DeliveryID)
	resp, err := e.client.Do(req)
	if err != nil {
		return result{err: err}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody))
	_ = resp.Body.Close()
	return result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
}

// Step runs FanOut until it has caught up (at most a few batches), then
// Deliver once.
func (e *Engine) Step(ctx context.Context, fence Fence) error {
	var errs []error
	for range 10 {
		n, err := e.FanOut(ctx, fence, e.eo.Batch)
		if err != nil {
			errs = append(errs, fmt.Errorf("fan-out: %w", err))
			break
		}
		if n < e.eo.Batch {
			break
		}
	}
	if _, err := e.Deliver(ctx, fence, e.eo.Batch); err != nil {
		errs = append(errs, fmt.Errorf("deliver: %w", err))
	}
	return errors.Join(errs...)
}

// Run alternates FanOut and Deliver until ctx ends: at once, then on
// every wake-up (wake, the notifier's), when an attempt ends (a place is
// free), and every poll at the latest. When ctx ends it waits for the
// attempts in flight, which give their claims back. It is Periodic run
// without a lease's runner (tests and benchmarks).
func (e *Engine) Run(ctx context.Context, fence Fence, wake <-chan struct{}, poll time.Duration) {
	p := e.Periodic(nil, poll)
	p.Also = append(p.Also, wake)
	_ = p.RunFenced(ctx, fence)
}

// Periodic is webhook delivery as a background job (workers.Periodic)
// woken by n's outbox topic: its start gives back the claims an earlier
// holder of its lease left; each pass is a Step (fan-out, then delivery,
// whose attempts run on and are waited for as the run ends); it rechecks
// sooner, doubling from 2 ms up to poll, while committed rows wait behind
// an older transaction.
func (e *Engine) Periodic(n *notify.Notifier, poll time.Duration) *workers.Periodic {
	if poll <= 0 {
		poll = time.Second
	}
	lastGauge := time.Time{}
	const firstRecheck = 2 * time.Millisecond
	recheck := firstRecheck
	return &workers.Periodic{
		Name: "webhooks", Interval: poll, Wake: notify.TopicOutbox, Notifier: n, Log: e.log,
		Also: []<-chan struct{}{e.freed},
		// Claims made under an older epoch (a killed or fenced-off
		// holder) would otherwise hold their webhooks' places until
		// ClaimTTL.
		Start: func(ctx context.Context, fence workers.Fence) error {
			return e.tx(ctx, fence, func(q *db.Queries) error {
				n, err := q.ReleaseClaims(ctx, e.now())
				if n > 0 {
					e.log.Info("released the claims of an earlier lease holder", "claims", n)
				}
				return err
			})
		},
		Pass: func(ctx context.Context, fence workers.Fence) error {
			err := e.Step(ctx, fence)
			if e.metrics != nil && time.Since(lastGauge) >= poll {
				lastGauge = time.Now()
				e.gaugeOldest(ctx)
			}
			return err
		},
		Next: func() time.Duration {
			if !e.heldBack.Load() {
				recheck = firstRecheck
				return poll
			}
			next := recheck
			recheck = min(2*recheck, poll)
			return next
		},
		Drain: e.Wait,
	}
}

func (e *Engine) gaugeOldest(ctx context.Context) {
	now := e.now()
	oldest, err := e.store.Queries().OldestPendingDelivery(ctx, now)
	if err != nil {
		return
	}
	e.metrics.oldestPending(now.Sub(oldest))
}
