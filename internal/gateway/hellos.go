package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"expvar"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/pki"
	"computeplane/internal/store"
)

// The hellos that reach a gateway together (thousands within seconds after
// a restart) open their sessions in one statement (db.OpenSessions): a
// batch is what arrived within HelloBatchWindow of its first hello, at most
// HelloBatchMax, and while HelloBatchesInFlight batches are running the
// next one keeps collecting. A node that needs more than the session row
// (joining, down, a new underlay; missing or retired: refused) is not
// opened by the batch and takes openRow's transaction instead.
const (
	HelloBatchWindow     = time.Millisecond
	HelloBatchMax        = 256
	HelloBatchesInFlight = 2
	// HelloRetryAfter is the retryAfterMs of a hello refused because the
	// database did not answer in time (UNAVAILABLE).
	HelloRetryAfter = time.Second
)

// Counters of this process's gateway (expvar "gateway", served with pprof
// on SERVICE_PPROF_ADDR): the benchmark reads round trips per hello and
// statuses skipped from them.
var (
	stats              = expvar.NewMap("gateway")
	statHellos         = new(expvar.Int) // sessions opened
	statHelloTrips     = new(expvar.Int) // database round trips of the session rows
	statHelloBatches   = new(expvar.Int) // OpenSessions statements
	statHelloSlow      = new(expvar.Int) // hellos that took openRow's transaction
	statStatusWrites   = new(expvar.Int) // statuses written
	statStatusSkipped  = new(expvar.Int) // statuses equal to the last written, not written
	statStatusSkipOpen = new(expvar.Int) // of them, the first of a session (its hash came from the row)
	statChainsVerified = new(expvar.Int) // client chains verified (x509)
	statChainsCached   = new(expvar.Int) // client chains found verified before (chaincache.go)
	statChainsResumed  = new(expvar.Int) // client chains of resumed sessions, not verified again (tickets.go)
	statHandshakes     = new(expvar.Int) // mutual-TLS handshakes completed (Handshakes)
	statDispatches     = new(expvar.Int) // reads of every session's pending specs and commands
	statDispatchOpened = new(expvar.Int) // reads of the pending specs and commands of sessions just opened
	// Gauges of the handshakes' turns (handshakes.go): slots held
	// (computing) and handshakes waiting for one.
	statHandshaking      = new(expvar.Int)
	statHandshakeWaiting = new(expvar.Int)
)

// Handshakes is the count of mutual-TLS handshakes this process's
// gateways completed: a gateway-only process's collector target follows
// its rate (internal/gctarget).
func Handshakes() int64 { return statHandshakes.Value() }

func init() {
	stats.Set("hellos", statHellos)
	stats.Set("helloRoundTrips", statHelloTrips)
	stats.Set("helloBatches", statHelloBatches)
	stats.Set("helloSlow", statHelloSlow)
	stats.Set("statusWrites", statStatusWrites)
	stats.Set("statusSkipped", statStatusSkipped)
	stats.Set("statusSkippedFirst", statStatusSkipOpen)
	stats.Set("chainsVerified", statChainsVerified)
	stats.Set("chainsCached", statChainsCached)
	stats.Set("chainsResumed", statChainsResumed)
	stats.Set("handshakes", statHandshakes)
	stats.Set("dispatches", statDispatches)
	stats.Set("dispatchesOpened", statDispatchOpened)
	stats.Set("handshaking", statHandshaking)
	stats.Set("handshakesWaiting", statHandshakeWaiting)
}

// openReq is one hello waiting for its session row.
type openReq struct {
	node string
	row  openRowArgs
	done chan openRes // buffered: the batch never waits for its reader
}

// openRowArgs is what a hello writes into the node's row.
type openRowArgs struct {
	transport, agentVersion, certSerial, inventory, gpuModel, underlay string
	proto                                                              int32
	observedGen                                                        int64
	certNotAfter                                                       time.Time
	vcpu, gpus                                                         int32
	memoryMiB, diskGiB                                                 int64
}

// openRes is a session row's outcome.
type openRes struct {
	epoch      int64
	statusHash uint64 // of the node's last status written; 0: unknown
	slow       bool   // not opened by the batch: openRow's transaction
	err        error
}

func newOpenRowArgs(cert *x509.Certificate, transport string, proto int, h *agentproto.Hello) openRowArgs {
	inv, _ := json.Marshal(h.Inventory)
	underlay := ""
	if h.Inventory.Underlay.IsValid() {
		underlay = h.Inventory.Underlay.String()
	}
	return openRowArgs{
		transport: transport, agentVersion: h.AgentVersion, certSerial: pki.SerialHex(cert), inventory: string(inv),
		gpuModel: h.Inventory.GPUModel, underlay: underlay, proto: int32(proto), observedGen: h.ObservedGeneration,
		certNotAfter: cert.NotAfter, vcpu: int32(h.Inventory.VCPU), gpus: int32(h.Inventory.GPUs),
		memoryMiB: h.Inventory.MemoryMiB, diskGiB: h.Inventory.DiskGiB,
	}
}

// helloBatcher gathers hellos into OpenSessions statements.
type helloBatcher struct {
	g     *Gateway
	in    chan *openReq
	slots chan struct{} // batches running
	freed chan struct{} // a batch finished (a wake-up, buffered)

	mu   sync.Mutex
	busy map[string]bool // the nodes of the batches running
}

func newHelloBatcher(g *Gateway) *helloBatcher {
	return &helloBatcher{g: g, in: make(chan *openReq), slots: make(chan struct{}, HelloBatchesInFlight),
		freed: make(chan struct{}, 1), busy: map[string]bool{}}
}

func (b *helloBatcher) isBusy(node string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.busy[node]
}

func (b *helloBatcher) setBusy(batch []*openReq, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range batch {
		if on {
			b.busy[r.node] = true
		} else {
			delete(b.busy, r.node)
		}
	}
}

// batchHellos turns the batches off (tests compare both ways): every
// hello takes openRow's transaction then.
var batchHellos atomic.Bool

func init() { batchHellos.Store(true) }

// open writes a hello's session row through a batch; ctx bounds the wait.
func (b *helloBatcher) open(ctx context.Context, node string, row openRowArgs) openRes {
	if !batchHellos.Load() {
		return openRes{slow: true}
	}
	r := &openReq{node: node, row: row, done: make(chan openRes, 1)}
	select {
	case b.in <- r:
	case <-ctx.Done():
		return openRes{err: ctx.Err()}
	}
	select {
	case res := <-r.done:
		return res
	case <-ctx.Done():
		// The batch may still open the row after this hello gave up: the
		// row would then name this gateway for a session it does not
		// hold, and the sweeper never marks a node down whose row names a
		// live gateway. Close it when the answer comes.
		go func() {
			select {
			case res := <-r.done:
				if res.err == nil && !res.slow {
					b.g.closeRow(r.node, res.epoch)
				}
			case <-time.After(2 * WriteTimeout): // the batch never ran (the gateway stopped)
			}
		}()
		return openRes{err: ctx.Err()}
	}
}

// run gathers batches until ctx ends. A node appears at most once in a
// batch (an UPDATE ... FROM updates a row once, whatever joins it) and in
// one running batch (a second batch would skip its locked row): its second
// hello goes into a batch after the first one's finished, and so gets the
// higher epoch, as one after the other would.
func (b *helloBatcher) run(ctx context.Context) {
	var carry []*openReq
	for {
		if len(carry) == 0 {
			select {
			case <-ctx.Done():
				return
			case r := <-b.in:
				carry = append(carry, r)
			}
		}
		batch := make([]*openReq, 0, min(HelloBatchMax, 16))
		seen := make(map[string]bool, 16)
		var next []*openReq
		add := func(r *openReq) {
			if seen[r.node] || len(batch) >= HelloBatchMax || b.isBusy(r.node) {
				next = append(next, r)
				return
			}
			seen[r.node] = true
			batch = append(batch, r)
		}
		for _, r := range carry {
			add(r)
		}
		if len(batch) == 0 {
			// Every waiting hello's node is in a running batch: wait for
			// one to finish (or another hello).
			select {
			case <-ctx.Done():
				return
			case <-b.freed:
			case r := <-b.in:
				next = append(next, r)
			}
			carry = next
			continue
		}
		window := time.NewTimer(HelloBatchWindow)
	collect:
		for len(batch) < HelloBatchMax {
			select {
			case <-ctx.Done():
				window.Stop()
				return
			case r := <-b.in:
				add(r)
			case <-window.C:
				break collect
			}
		}
		window.Stop()
		// Wait for a free slot, still gathering.
	slot:
		for {
			if len(batch) >= HelloBatchMax {
				select {
				case <-ctx.Done():
					return
				case b.slots <- struct{}{}:
					break slot
				}
			}
			select {
			case <-ctx.Done():
				return
			case b.slots <- struct{}{}:
				break slot
			case r := <-b.in:
				add(r)
			}
		}
		carry = next
		b.setBusy(batch, true)
		go func(batch []*openReq) {
			defer func() {
				b.setBusy(batch, false)
				<-b.slots
				select {
				case b.freed <- struct{}{}:
				default:
				}
			}()
			b.exec(batch)
		}(batch)
	}
}

// exec opens the batch's rows in one statement and answers each hello.
func (b *helloBatcher) exec(batch []*openReq) {
	g := b.g
	p := db.OpenSessionsParams{GatewayID: pgtype.Text{String: g.id, Valid: true}}
	for _, r := range batch {
		a := &r.row
		p.NodeIds = append(p.NodeIds, r.node)
		p.Transports = append(p.Transports, a.transport)
		p.AgentVersions = append(p.AgentVersions, a.agentVersion)
		p.AgentProtocols = append(p.AgentProtocols, a.proto)
		p.Inventories = append(p.Inventories, a.inventory)
		p.ObservedGenerations = append(p.ObservedGenerations, a.observedGen)
		p.CertNotAfters = append(p.CertNotAfters, a.certNotAfter)
		p.CertSerials = append(p.CertSerials, a.certSerial)
		p.Vcpus = append(p.Vcpus, a.vcpu)
		p.MemoryMibs = append(p.MemoryMibs, a.memoryMiB)
		p.DiskGibs = append(p.DiskGibs, a.diskGiB)
		p.Gpus = append(p.Gpus, a.gpus)
		p.GpuModels = append(p.GpuModels, a.gpuModel)
		p.Underlays = append(p.Underlays, a.underlay)
	}
	var trips atomic.Int64
	ctx, cancel := context.WithTimeout(store.CountRoundTrips(context.WithoutCancel(g.ctx), &trips), WriteTimeout)
	// In a transaction of the store's: the server bounds the statement by
	// the time left (statement_timeout), so that it cannot commit after
	// the hellos gave up on it (a statement alone would commit whenever
	// the server got to it). BEGIN goes with the statement: two round
	// trips a batch.
	var rows []db.OpenSessionsRow
	err := g.o.Store.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) (err error) {
		rows, err = db.New(tx).OpenSessions(ctx, p)
		return err
	})
	cancel()
	statHelloBatches.Add(1)
	statHelloTrips.Add(trips.Load())
	if err != nil {
		// The database did not answer: every hello of the batch is
		// refused with a retry delay. It answered with an error (a
		// value of one hello's it cannot hold): each hello takes
		// openRow's transaction, so that one hello never fails the
		// others of its batch, on every retry.
		slow := !store.Unavailable(err)
		for _, r := range batch {
			if slow {
				r.done <- openRes{slow: true}
			} else {
				r.done <- openRes{err: err}
			}
		}
		return
	}
	opened := make(map[string]db.OpenSessionsRow, len(rows))
	for _, row := range rows {
		opened[row.NodeID] = row
	}
	for _, r := range batch {
		row, ok := opened[r.node]
		if !ok {
			r.done <- openRes{slow: true}
			continue
		}
		r.done <- openRes{epoch: row.SessionEpoch, statusHash: uint64(row.StatusHash.Int64)}
	}
}

// refusal is a hello refused for what the node is (missing, retired), not
// for the database's state: INVALID_STATE, where a database error is
// UNAVAILABLE with a retry delay.
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }

func isRefusal(err error) bool {
	var r *refusal
	return errors.As(err, &r)
}

// isBadValue reports whether the database refused a value of the hello's
// (a data exception, SQLSTATE class 22): a retry would fail the same way.
func isBadValue(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}
