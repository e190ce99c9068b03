package nodework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/notify"
)

// ResultHandler follows the result of a command of its kind (a snapshot
// taken, say), in the transaction that writes the result. It says whether
// it wrote events.
type ResultHandler func(ctx context.Context, tx pgx.Tx, node string, r *agentproto.Result) (bool, error)

// RegisterResult sets the handler of one kind of command (node_commands.kind);
// a kind has one owner, so a second registration panics.
func (g *Registry) RegisterResult(kind string, h ResultHandler) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, dup := g.results[kind]; dup {
		panic(fmt.Sprintf("nodework: a result handler for kind %q twice", kind))
	}
	if g.results == nil {
		g.results = map[string]ResultHandler{}
	}
	g.results[kind] = h
}

// ApplyResult writes a command's result as node's daemon sent it, in tx,
// then follows it by the handler of the command's kind, and wakes the
// calls waiting for it after the commit (ResultTopic). A result for a
// command that is finished already (sent again after a reconnect: the
// daemon journals results) or is not the node's is skipped: applied is
// false and nothing is written. It reports whether a handler wrote events.
func (g *Registry) ApplyResult(ctx context.Context, tx pgx.Tx, node string, r *agentproto.Result) (applied, events bool, err error) {
	state := "failed"
	if r.OK {
		state = "succeeded"
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return false, false, err
	}
	kind, err := db.New(tx).FinishCommand(ctx, db.FinishCommandParams{State: state, Result: raw, CommandID: r.ID, NodeID: node})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	notify.Later(ctx, ResultTopic(r.ID))
	g.mu.RLock()
	h := g.results[kind]
	g.mu.RUnlock()
	if h == nil {
		return true, false, nil
	}
	events, err = h(ctx, tx, node, r)
	return true, events, err
}
