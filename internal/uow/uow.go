// Package uow is the unit of work: one transaction and what rides on it —
// the outbox events it holds until just before commit, the topics to wake
// once it has committed, and the continuation that answers an RPC call
// after commit. The rpc envelope and the background jobs build it the same
// way (Run); outbox.Write, notify.Later and rpc.Then add to the unit they
// find in the context, and the builder acts on it after the commit.
package uow

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/reqmeta"
	"computeplane/internal/store"
)

// Transactor runs a function in one transaction (store.Store).
type Transactor interface {
	WithTx(ctx context.Context, readOnly bool, fn func(ctx context.Context, tx pgx.Tx) error) error
}

// Unit is one unit of work. Its methods are safe for concurrent use.
type Unit struct {
	// Tx is the unit's transaction, set while fn of Run runs.
	Tx pgx.Tx

	mu     sync.Mutex
	events []json.RawMessage
	wrote  bool
	wakes  []string
	offers []Offer
	then   func(ctx context.Context) (any, error)
}

// Offer is a value for the taker of a topic in this process, handed over
// once the unit committed (notify.OfferLater). Instead: the offer stands
// for the topic's wake (notify.OfferInstead).
type Offer struct {
	Topic   string
	Value   any
	Instead bool
}

type key struct{}

// From returns the unit of work ctx runs in, nil outside one.
func From(ctx context.Context) *Unit {
	u, _ := ctx.Value(key{}).(*Unit)
	return u
}

// Run runs fn in one transaction of st as a unit of work: the context fn
// gets carries u, so the events written in it are held and written in one
// statement just before commit (unless fn took them: TakeEvents). After Run
// returns without error the caller wakes u's topics (notify's WakeUnit)
// and runs its continuation, if it has one.
func Run(ctx context.Context, st Transactor, readOnly bool, fn func(ctx context.Context, u *Unit) error) (*Unit, error) {
	u := &Unit{}
	err := st.WithTx(ctx, readOnly, func(ctx context.Context, tx pgx.Tx) error {
		u.reset(tx)
		ctx = context.WithValue(ctx, key{}, u)
		if err := fn(ctx, u); err != nil {
			return err
		}
		return u.flush(ctx)
	})
	return u, err
}

// reset starts an attempt of the transaction afresh.
func (u *Unit) reset(tx pgx.Tx) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.Tx, u.events, u.wrote, u.wakes, u.offers, u.then = tx, nil, false, nil, nil, nil
}

// Hold keeps an event (its outbox row as JSON) until the unit commits.
func (u *Unit) Hold(row json.RawMessage) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.events = append(u.events, row)
	u.wrote = true
}

// TakeEvents returns the held events as a JSON array and forgets them: the
// caller writes them in the unit's transaction (audit.Record writes them
// with the call's audit row).
func (u *Unit) TakeEvents() []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := []byte("[") // an array even when empty: null is a scalar to jsonb
	for i, e := range u.events {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, e...)
	}
	u.events = nil
	return append(out, ']')
}

// Wrote reports whether the unit wrote outbox events.
func (u *Unit) Wrote() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.wrote
}

func (u *Unit) flush(ctx context.Context) error {
	u.mu.Lock()
	n := len(u.events)
	u.mu.Unlock()
	if n == 0 {
		return nil
	}
	meta := reqmeta.FromContext(ctx)
	// The unit's last write: it travels with the COMMIT (store.Later).
	return db.New(store.Later(u.Tx)).InsertEvents(ctx, db.InsertEventsParams{
		RequestID: text(meta.RequestID), Traceparent: text(meta.Traceparent), Events: u.TakeEvents(),
	})
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

// WakeAfter asks for topic to be woken once the unit has committed.
func (u *Unit) WakeAfter(topic string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.wakes = append(u.wakes, topic)
}

// Wakes returns the topics to wake after the commit, and forgets them.
func (u *Unit) Wakes() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	w := u.wakes
	u.wakes = nil
	return w
}

// OfferAfter asks for o.Value to be handed to o.Topic's taker once the
// unit has committed (with o.Instead, in place of the topic's wake).
func (u *Unit) OfferAfter(o Offer) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.offers = append(u.offers, o)
}

// Offers returns the values to hand over after the commit, and forgets
// them.
func (u *Unit) Offers() []Offer {
	u.mu.Lock()
	defer u.mu.Unlock()
	o := u.offers
	u.offers = nil
	return o
}

// Then sets the continuation: what answers the call once the unit has
// committed (the Waiting convention). The last one set wins.
func (u *Unit) Then(fn func(ctx context.Context) (any, error)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.then = fn
}

// Continuation is the continuation set by Then, nil when none.
func (u *Unit) Continuation() func(ctx context.Context) (any, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.then
}
