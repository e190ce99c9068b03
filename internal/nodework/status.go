package nodework

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/notify"
	"computeplane/internal/store"
	"computeplane/internal/usage"
)

// StatusHandler follows one instance of its kind whose row a daemon's
// report just moved (r is the row after the report; reported what the
// daemon said of it), in the report's transaction. It says whether it
// wrote events.
type StatusHandler func(ctx context.Context, tx pgx.Tx, node string, r db.Instance, reported agentproto.InstanceStatus) (bool, error)

// StatusQueue lets the handler of one kind send its statement in the
// status's first round trip: it queues the statement in p (which runs
// after the rows' updates, so it sees the moved rows; running are the
// reported ids the daemon says run) and returns the handler for this
// status, which reads the statement's answer instead of a round trip of
// its own. It queues nothing and returns nil when no instance needs it.
type StatusQueue func(ctx context.Context, p *store.Pipeline, node string, running []string) StatusHandler

// VolumesHandler follows the volume files a daemon reports (nil: it does
// not report them), in the report's transaction: it queues its first
// statement in p, which goes in the status's first round trip with the
// instances' rows, and returns what runs once that answered (after the
// instances' handlers), which reports whether it wrote events; nil when it
// queued nothing.
type VolumesHandler func(ctx context.Context, p *store.Pipeline, node string, reported []agentproto.VolumeStatus) func(ctx context.Context, tx pgx.Tx) (bool, error)

// Registry holds the status handlers the groups register at start (the
// host fills it before the gateway role runs); the gateway calls
// ApplyStatus with each status that changed. A kind without a handler
// only has its rows moved (a warm instance publishes nothing).
type Registry struct {
	// Now is the clock of the usage a status meters (the hour a VM's
	// egress bytes count in); nil is time.Now.
	Now func() time.Time

	mu      sync.RWMutex
	kinds   map[string]StatusHandler
	queues  map[string]StatusQueue
	volumes []VolumesHandler
	results map[string]ResultHandler
}

// Register sets the handler of one kind of instance (instances.kind);
// a kind has one owner, so a second registration panics.
func (g *Registry) Register(kind string, h StatusHandler) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, dup := g.kinds[kind]; dup {
		panic(fmt.Sprintf("nodework: a status handler for kind %q twice", kind))
	}
	if g.kinds == nil {
		g.kinds = map[string]StatusHandler{}
	}
	g.kinds[kind] = h
}

// RegisterQueue sets the pipelined handler of one kind (StatusQueue),
// used instead of its Register handler for a status it queued for.
func (g *Registry) RegisterQueue(kind string, q StatusQueue) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, dup := g.queues[kind]; dup {
		panic(fmt.Sprintf("nodework: a status queue for kind %q twice", kind))
	}
	if g.queues == nil {
		g.queues = map[string]StatusQueue{}
	}
	g.queues[kind] = q
}

// RegisterVolumes adds a handler of the volumes a daemon reports.
func (g *Registry) RegisterVolumes(h VolumesHandler) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.volumes = append(g.volumes, h)
}

// ApplyStatus moves the instances of a node as its daemon reported them,
// in tx: the rows first (state, error, identity, timings; an instance the
// daemon no longer reports is gone), then each moved row's kind handler,
// in the order of the report so events come out in a stable order, then
// the volume handlers; the VMs' egress counters are metered
// (usage.MeterEgress). It reports whether a handler wrote events.
//
// The rows' updates go in one round trip after the statements p holds
// (nil: none; the gateway queues its node row update there, which BEGIN
// joins); checked, when set, runs once they answered and an error from it
// ends the status there (the transaction rolls back). A status that moves
// nothing else costs that round trip and the commit.
func (g *Registry) ApplyStatus(ctx context.Context, tx pgx.Tx, node string, st *agentproto.Status, p *store.Pipeline, checked func() error) (bool, error) {
	if p == nil {
		p = &store.Pipeline{}
	}
	nodeID := pgtype.Text{String: node, Valid: true}
	ids := make([]string, 0, len(st.Instances))
	rp := db.ReportInstancesParams{NodeID: nodeID}
	known := map[string]agentproto.InstanceStatus{}
	counts := make([]usage.EgressCount, 0, len(st.Instances))
	for _, in := range st.Instances {
		ids = append(ids, in.ID)
		counts = append(counts, usage.EgressCount{InstanceID: in.ID, Tx: in.EgressTxBytes, Rx: in.EgressRxBytes})
		switch in.State {
		case agentproto.StateStarting, agentproto.StateRunning, agentproto.StateStopped, agentproto.StatePaused, agentproto.StateFailed:
		default:
			continue // a state this version does not know
		}
		var timings []byte
		if in.Timings != nil {
			timings, _ = json.Marshal(in.Timings)
		}
		known[in.ID] = in
		rp.InstanceIds, rp.States, rp.Errors = append(rp.InstanceIds, in.ID), append(rp.States, in.State), append(rp.Errors, in.Error)
		rp.ReportedIdentities, rp.HostTimings = append(rp.ReportedIdentities, in.Identity), append(rp.HostTimings, string(timings))
	}
	// The instances the daemon no longer reports are other rows than the
	// ones it reports: both updates go in one round trip.
	var changed []db.Instance
	var err, goneErr error
	p.Queue(func(q *db.Queries) { changed, err = q.ReportInstances(ctx, rp) })
	p.Queue(func(q *db.Queries) {
		_, goneErr = q.GoneInstances(ctx, db.GoneInstancesParams{NodeID: nodeID, Reported: ids})
	})
	g.mu.RLock()
	defer g.mu.RUnlock()
	var queued map[string]StatusHandler // this status's handlers, by kind, that queued a statement
	if len(g.queues) > 0 {
		var running []string
		for _, in := range st.Instances {
			if in.State == agentproto.StateRunning {
				running = append(running, in.ID)
			}
		}
		if len(running) > 0 {
			for kind, q := range g.queues {
				if h := q(ctx, p, node, running); h != nil {
					if queued == nil {
						queued = map[string]StatusHandler{}
					}
					queued[kind] = h
				}
			}
		}
	}
	volumes := make([]func(context.Context, pgx.Tx) (bool, error), 0, len(g.volumes))
	for _, h := range g.volumes {
		volumes = append(volumes, h(ctx, p, node, st.Volumes))
	}
	if serr := p.Send(ctx, tx); err == nil {
		err = cmp.Or(goneErr, serr)
	}
	if err == nil && checked != nil {
		err = checked()
	}
	if err != nil {
		return false, err
	}
	slices.SortFunc(changed, func(a, b db.Instance) int {
		return cmp.Compare(slices.Index(rp.InstanceIds, a.InstanceID), slices.Index(rp.InstanceIds, b.InstanceID))
	})
	events := false
	for _, r := range changed {
		if r.State != agentproto.StateStarting {
			// Its waits re-read. No wait ends on starting (they wait for
			// running, stopped, paused, failed or deleted, and the answer
			// does not change: a sandbox stays creating), so a claim's or a
			// boot's starting costs its waits no read while the VM starts;
			// their backoff still reads.
			notify.Later(ctx, InstanceTopic(r.InstanceID))
		}
		h := queued[r.Kind]
		if h == nil {
			h = g.kinds[r.Kind]
		}
		if h == nil {
			continue
		}
		wrote, err := h(ctx, tx, node, r, known[r.InstanceID])
		if err != nil {
			return false, err
		}
		events = events || wrote
	}
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	if err := usage.MeterEgress(ctx, tx, node, counts, now()); err != nil {
		return false, err
	}
	for _, then := range volumes {
		if then == nil {
			continue
		}
		wrote, err := then(ctx, tx)
		if err != nil {
			return false, err
		}
		events = events || wrote
	}
	return events, nil
}
