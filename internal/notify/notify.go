// Package notify carries best-effort wake-ups after commit, so that work
// starts in milliseconds instead of at the next poll; it is never a source
// of truth, and a missed wake-up only delays work to that poll.
//
// Wake is called after a commit, outside any transaction. It wakes the
// subscribers of the topic in this process at once. With the postgres kind
// it also marks the topic for other processes: a single sender goroutine
// issues the NOTIFYs on a connection of its own, in one statement per
// batch, at most one batch per SendInterval, so a burst of wakes costs one
// NOTIFY per topic and never adds a NOTIFY (and the database-wide lock that
// NOTIFY takes at commit) to a mutation's transaction. A listener
// connection of its own LISTENs and wakes the local subscribers, ignoring
// the process's own NOTIFYs (it woke them already).
package notify

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"computeplane/gen/db"
	"computeplane/internal/config"
	"computeplane/internal/store"
	"computeplane/internal/uow"
)

// Channel is the one PostgreSQL channel; the payload is the topic.
const Channel = "computeplane_wake"

// TopicOutbox is woken after every committed mutation (the rpc envelope's
// AfterCommit): new outbox rows may be there.
const TopicOutbox = "outbox"

// SendInterval is the coalescing window: at most one NOTIFY per topic per
// interval.
const SendInterval = 10 * time.Millisecond

// Application names of the notifier's connections (pg_stat_activity).
const (
	appSender   = "computed-notify-send"
	appListener = "computed-notify-listen"
)

const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// Notifier wakes subscribers of topics.
type Notifier struct {
	log      *slog.Logger
	connCfg  *pgx.ConnConfig // nil: in-process only
	interval time.Duration

	mu      sync.Mutex
	subs    map[string]map[chan struct{}]struct{}
	takers  map[string][]*taker // Take
	pending map[string]struct{}
	kick    chan struct{}

	senderPID  atomic.Uint32
	listening  chan struct{}
	listenOnce sync.Once
	started    bool
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// New returns a Notifier. With cfg nil or of kind none it works within the
// process only; with kind postgres it also uses LISTEN/NOTIFY on the
// database of pool (connections of its own, opened by Start). log may be
// nil.
func New(cfg *config.Notifier, pool *pgxpool.Pool, log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Notifier{
		log:       log,
		interval:  SendInterval,
		subs:      map[string]map[chan struct{}]struct{}{},
		pending:   map[string]struct{}{},
		kick:      make(chan struct{}, 1),
		listening: make(chan struct{}),
	}
	if cfg != nil && cfg.Kind == config.NotifierPostgres && pool != nil {
		n.connCfg = pool.Config().ConnConfig.Copy()
	} else {
		close(n.listening)
	}
	return n
}

// CrossProcess reports whether wakes reach other processes.
func (n *Notifier) CrossProcess() bool { return n.connCfg != nil }

// Start starts the sender and the listener (postgres kind); they run until
// Close. Without them Wake still wakes this process.
func (n *Notifier) Start() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.started || n.connCfg == nil {
		return
	}
	n.started = true
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Go(func() { n.send(ctx) })
	n.wg.Go(func() { n.listen(ctx) })
}

// Close stops the sender and the listener; topics not sent yet are dropped.
func (n *Notifier) Close() {
	n.mu.Lock()
	cancel := n.cancel
	n.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	n.wg.Wait()
}

// Listening is closed once the listener has LISTENed (at once without
// one): wakes from other processes arrive from then on.
func (n *Notifier) Listening() <-chan struct{} { return n.listening }

// Wake wakes the subscribers of topic in this process now and, with the
// postgres kind, in the other processes within about SendInterval. It
// never blocks. Call it after commit, outside any transaction.
func (n *Notifier) Wake(topic string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.wakeLocked(topic)
	if n.connCfg != nil {
		n.pending[topic] = struct{}{}
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
}

// Subscribe returns a channel that receives a value after each Wake of
// topic; wakes coalesce while one is unread (a buffer of one). cancel
// ends the subscription; the channel is never closed.
func (n *Notifier) Subscribe(topic string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	if n.subs[topic] == nil {
		n.subs[topic] = map[chan struct{}]struct{}{}
	}
	n.subs[topic][ch] = struct{}{}
	n.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			delete(n.subs[topic], ch)
			if len(n.subs[topic]) == 0 {
				delete(n.subs, topic)
			}
		})
	}
}

func (n *Notifier) wakeLocked(topic string) {
	for ch := range n.subs[topic] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (n *Notifier) wakeLocal(topic string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.wakeLocked(topic)
}

// wakeAll wakes every local subscriber, after the listener missed
// notifications while reconnecting.
func (n *Notifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for topic := range n.subs {
		n.wakeLocked(topic)
	}
}

// take returns the pending topics and clears them.
func (n *Notifier) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	topics := make([]string, 0, len(n.pending))
	for t := range n.pending {
		topics = append(topics, t)
	}
	clear(n.pending)
	return topics
}

// requeue puts back topics a failed send did not deliver.
func (n *Notifier) requeue(topics []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range topics {
		n.pending[t] = struct{}{}
	}
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Notifier) connect(ctx context.Context, app string) (*pgx.Conn, error) {
	cfg := n.connCfg.Copy()
	cfg.RuntimeParams["application_name"] = app
	return pgx.ConnectConfig(ctx, cfg)
}

// send issues the pending topics' NOTIFYs, one batch per interval.
func (n *Notifier) send(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		}
		topics := n.take()
		if len(topics) == 0 {
			continue
		}
		var err error
		if conn == nil {
			if conn, err = n.connect(ctx, appSender); err == nil {
				n.senderPID.Store(conn.PgConn().PID())
			}
		}
		if err == nil {
			err = db.New(conn).Notify(ctx, db.NotifyParams{Channel: Channel, Topics: topics})
		}
		delay := n.interval
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if conn != nil {
				closeConn(conn)
				conn = nil
			}
			fails++
			delay = retryDelay(fails)
			n.log.Warn("notifier: send", "error", err.Error(), "retryIn", delay.String())
			n.requeue(topics)
		} else {
			fails = 0
		}
		if !sleep(ctx, delay) {
			return
		}
	}
}

// listen LISTENs on a connection of its own, reconnecting with backoff.
func (n *Notifier) listen(ctx context.Context) {
	fails := 0
	for connected := false; ctx.Err() == nil; {
		conn, err := n.connect(ctx, appListener)
		if err == nil {
			if _, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{Channel}.Sanitize()); err != nil {
				closeConn(conn)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			fails++
			n.log.Warn("notifier: listen", "error", err.Error())
			if !sleep(ctx, retryDelay(fails)) {
				return
			}
			continue
		}
		fails = 0
		n.listenOnce.Do(func() { close(n.listening) })
		if connected {
			n.wakeAll() // what was sent while this was away is lost
		}
		connected = true
		for {
			nt, err := conn.WaitForNotification(ctx)
			if err != nil {
				if ctx.Err() == nil {
					n.log.Warn("notifier: listen", "error", err.Error())
				}
				break
			}
			if nt.PID != n.senderPID.Load() {
				n.wakeLocal(nt.Payload)
			}
		}
		closeConn(conn)
	}
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

func retryDelay(fails int) time.Duration {
	d := retryMin
	for i := 1; i < fails && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Later asks for topic to be woken once the unit of work ctx runs in
// (uow.Run) has committed; it does nothing outside one.
func Later(ctx context.Context, topic string) {
	if u := uow.From(ctx); u != nil {
		u.WakeAfter(topic)
	}
}

// OfferLater asks for v to be handed, once the unit of work ctx runs in
// has committed, to the taker of topic in this process (Take): what the
// woken subscriber would otherwise read back from the database. It is no
// more than a wake for other processes, or with no taker, so the taker
// must also do what a wake makes it do (the database stays the source of
// truth); the caller wakes topic itself (Later).
//
// tx is the transaction v was written in: from a savepoint nothing is
// offered, since the savepoint's rollback would undo the write and not
// the offer (a taker would act on rows that never committed); the wake
// alone makes the subscriber read what did.
func OfferLater(ctx context.Context, tx pgx.Tx, topic string, v any) {
	if u := uow.From(ctx); u != nil && store.Outermost(tx) {
		u.OfferAfter(uow.Offer{Topic: topic, Value: v})
	}
}

// OfferInstead offers v, as OfferLater does, in place of a wake of topic:
// once the unit committed, a taker of topic in this process gets v and
// the topic is not woken for it (the taker has what the wake would make
// its subscriber read back); with no taker here the topic is woken as
// Later wakes it, so that the subscribers of other processes read it. From
// a savepoint nothing is offered and the topic is woken. Only for a topic
// whose taker, when it is in this process, is the one subscriber the wake
// is for (a gateway's topic: its dispatch loop takes and subscribes).
func OfferInstead(ctx context.Context, tx pgx.Tx, topic string, v any) {
	u := uow.From(ctx)
	switch {
	case u == nil:
	case store.Outermost(tx):
		u.OfferAfter(uow.Offer{Topic: topic, Value: v, Instead: true})
	default:
		u.WakeAfter(topic)
	}
}

// taker is one Take's function (a pointer, so that its cancel removes
// that one).
type taker struct{ fn func(any) }

// Take makes fn a taker of the values offered on topic in this process:
// every taker of the topic gets each value (a gateway takes its topic, a
// waiting call the topic of the row it waits on). fn runs on the
// committing goroutine, before the unit's wakes: it must not block.
// cancel ends it.
func (n *Notifier) Take(topic string, fn func(v any)) (cancel func()) {
	tk := &taker{fn}
	n.mu.Lock()
	if n.takers == nil {
		n.takers = map[string][]*taker{}
	}
	n.takers[topic] = append(slices.Clip(n.takers[topic]), tk) // a copy: WakeUnit reads the old one unlocked
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			left := slices.DeleteFunc(slices.Clone(n.takers[topic]), func(t *taker) bool { return t == tk })
			if len(left) == 0 {
				delete(n.takers, topic)
			} else {
				n.takers[topic] = left
			}
		})
	}
}

// WakeUnit hands, after u committed, the values it offered to their
// takers (OfferLater), then wakes the topics it asked for (Later) and
// those offered instead of a wake that no taker here took (OfferInstead),
// and returns them.
func (n *Notifier) WakeUnit(u *uow.Unit) []string {
	var untaken []string
	if offers := u.Offers(); len(offers) > 0 {
		for _, o := range offers {
			n.mu.Lock()
			takers := n.takers[o.Topic] // never changed in place: Take and cancel copy
			n.mu.Unlock()
			for _, t := range takers {
				t.fn(o.Value)
			}
			if o.Instead && len(takers) == 0 {
				untaken = append(untaken, o.Topic)
			}
		}
	}
	topics := u.Wakes()
	for _, t := range untaken {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	for _, t := range topics {
		n.Wake(t)
	}
	return topics
}
