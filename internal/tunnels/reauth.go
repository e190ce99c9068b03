package tunnels

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"computeplane/gen/db"
	"computeplane/internal/iam"
)

// Why a tunnel ended, beyond exited, client, node, closed and failed.
const (
	ReasonRevoked  = "revoked"  // its session was revoked, or its caller may no longer open it
	ReasonIdle     = "idle"     // nothing passed either way for tunnels.limits.idleTimeoutMs
	ReasonShutdown = "shutdown" // the api replica relaying it stopped (SIGTERM)
)

// openAction is what opening a tunnel is decided as (catalog/tunnels.yaml):
// the re-authorizer decides it again while the tunnel is open.
const openAction = "compute:tunnels:manage"

// Identity is what the re-authorizer needs of the identity port: its
// events (iam.Cached.OnEvent) and fresh decisions (never cached).
type Identity interface {
	OnEvent(fn func(iam.Event)) (stop func())
	Require(ctx context.Context, c *iam.Caller, action string, r iam.Resource) error
}

// live is one tunnel this replica relays.
type live struct {
	row    db.Tunnel
	caller *iam.Caller // nil for a row of an older release: never re-decided
	last   atomic.Int64
	end    func(reason string)
}

func (l *live) touch() { l.last.Store(time.Now().UnixNano()) }

// tracker is the relay's view of its open tunnels: the re-authorizer and
// the idle and tunnels.close checks, one loop for all of a replica's
// tunnels rather than one per tunnel.
type tracker struct {
	rl *Relay

	start sync.Once
	mu    sync.Mutex
	open  map[string]*live
	// closing is set by Shutdown: no tunnel opens after it.
	closing  bool
	wg       sync.WaitGroup
	deciding atomic.Bool // a round of decisions runs
}

func (tr *tracker) add(l *live) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.closing {
		return false
	}
	if tr.open == nil {
		tr.open = map[string]*live{}
	}
	tr.open[l.row.TunnelID] = l
	tr.wg.Add(1)
	return true
}

func (tr *tracker) remove(id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if _, ok := tr.open[id]; ok {
		delete(tr.open, id)
		tr.wg.Done()
	}
}

func (tr *tracker) snapshot() []*live {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make([]*live, 0, len(tr.open))
	for _, l := range tr.open {
		out = append(out, l)
	}
	return out
}

// run starts the loop and the identity listener (Relay.tracked); they
// last as long as the process.
func (tr *tracker) run() {
	rl := tr.rl
	if rl.Identity != nil {
		rl.Identity.OnEvent(tr.heard)
	}
	go func() {
		check := time.NewTicker(orDefault(rl.CheckEvery, time.Second))
		defer check.Stop()
		reauth := time.NewTicker(orDefault(rl.ReauthEvery, iam.CredentialTTL))
		defer reauth.Stop()
		for {
			select {
			case <-check.C:
				tr.check()
			case <-reauth.C:
				// Beside the checks, which a slow identity service must
				// not hold up; one round at a time.
				if tr.deciding.CompareAndSwap(false, true) {
					go func() {
						defer tr.deciding.Store(false)
						for _, l := range tr.snapshot() {
							tr.decide(l)
						}
					}()
				}
			}
		}
	}()
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// heard applies an identity event: a revoked session closes its tunnels
// at once; any other event about an identity (its role changed) has its
// tunnels decided again. It runs on the inbox's goroutine: decisions go
// to their own.
func (tr *tracker) heard(e iam.Event) {
	for _, l := range tr.snapshot() {
		switch {
		case e.Session != "" && e.Session == l.row.Session:
			l.end(ReasonRevoked)
		case e.Session == "" && e.IdentityID != "" && e.IdentityID == l.row.IdentityID:
			go tr.decide(l)
		}
	}
}

// decide asks again whether the tunnel's caller may open it; a refusal
// (not an unavailable identity service) closes it. A delegated session's
// delegation is not asked again (its confirmation was given at the open;
// revoking it revokes the session).
func (tr *tracker) decide(l *live) {
	if l.caller == nil || tr.rl.Identity == nil {
		return
	}
	c := *l.caller
	c.DelegationID = ""
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	action, res := decision(l.row, tr.rl.TypePrefix)
	err := tr.rl.Identity.Require(ctx, &c, action, res)
	if errors.Is(err, iam.ErrDenied) || errors.Is(err, iam.ErrUnauthenticated) {
		l.end(ReasonRevoked)
	} else if err != nil {
		tr.rl.Log.Warn("tunnels: re-authorizing", "tunnel", l.row.TunnelID, "error", err.Error())
	}
}

// check closes the tunnels tunnels.close closed (one read for all) and
// the idle ones.
func (tr *tracker) check() {
	all := tr.snapshot()
	if len(all) == 0 {
		return
	}
	ids := make([]string, len(all))
	now := time.Now().UnixNano()
	for i, l := range all {
		ids[i] = l.row.TunnelID
		if idle := tr.rl.IdleTimeout; idle > 0 && now-l.last.Load() > int64(idle) {
			l.end(ReasonIdle)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	closed, err := db.New(tr.rl.Store.Pool()).TunnelsNotOpen(ctx, ids)
	if err != nil {
		return // the next second reads again
	}
	for _, id := range closed {
		tr.mu.Lock()
		l := tr.open[id]
		tr.mu.Unlock()
		if l != nil {
			l.end("closed")
		}
	}
}

// shutdown closes every tunnel (reason shutdown) and waits, until ctx
// ends, for their ends to be recorded; no tunnel opens afterwards.
func (tr *tracker) shutdown(ctx context.Context) error {
	tr.mu.Lock()
	tr.closing = true
	tr.mu.Unlock()
	for _, l := range tr.snapshot() {
		l.end(ReasonShutdown)
	}
	done := make(chan struct{})
	go func() { tr.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// callerOf reads the caller a tunnel's row keeps.
func callerOf(t db.Tunnel) *iam.Caller {
	if len(t.Caller) == 0 {
		return nil
	}
	var c iam.Caller
	if json.Unmarshal(t.Caller, &c) != nil || c.IdentityID == "" {
		return nil
	}
	return &c
}
