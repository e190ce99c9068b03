package vmruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"computeplane/internal/configerr"
	"computeplane/internal/qemu"
)

// The restore pool keeps qemu processes started ahead for the snapshots
// restored on this node, each with the snapshot's state loaded and its
// vCPUs never run (qemu -S -incoming defer, then the migration, its QMP
// connection held: qemu.Prestart), so that a restore spends a cont and the
// guest's first answer, not qemu's start, the QMP handshake and the
// migration (half of a restore's host share under TCG).
//
// On microvm everything a VM is made of is on qemu's command line: the
// snapshot's memory file as its RAM backend, its disks, its tap (a
// virtio-mmio device cannot be plugged later, and a NIC's netdev cannot
// be replaced). So a pooled qemu serves one snapshot and one shape (the
// restore's config but for its name and directory): a restore without
// volumes or network card, whose disk (if any) is the snapshot's. Other
// restores start qemu as before.
//
// Bounds: Size qemus per snapshot, for the Snapshots snapshots restored
// (or taken) most recently here; one prestart at a time, at WarmNice. A
// pooled qemu is taken by renaming its directory to the VM's; the pool is
// refilled in the background after each restore. DeleteSnapshot ends
// that snapshot's qemus, Close every one (they are not VMs: nothing
// outlives the daemon), and a daemon that starts ends what a crashed one
// left.

// Restore pool bounds (compute-agent --restore-pool, --restore-pool-snapshots).
const (
	MaxRestorePool          = 8
	MaxRestorePoolSnapshots = 64
)

// RestorePool configures the restore pool; Size 0 turns it off.
type RestorePool struct {
	Size      int // prestarted qemus kept per snapshot
	Snapshots int // snapshots with a pool, the most recently restored
}

// Check names the first problem of a restore pool's configuration
// (a *configerr.Error, INVALID_CONFIG naming the flag).
func (p RestorePool) Check() error {
	switch {
	case p.Size < 0 || p.Size > MaxRestorePool:
		return &configerr.Error{Option: "--restore-pool", Message: fmt.Sprintf("%d is outside 0 to %d qemus per snapshot", p.Size, MaxRestorePool)}
	case p.Snapshots < 1 || p.Snapshots > MaxRestorePoolSnapshots:
		return &configerr.Error{Option: "--restore-pool-snapshots", Message: fmt.Sprintf("%d is outside 1 to %d", p.Snapshots, MaxRestorePoolSnapshots)}
	}
	return nil
}

// Prestarter is a Launcher that starts VMs ahead of a restore (qemu's;
// the unit tests' fake does not, and runs no pool).
type Prestarter interface {
	Prestart(ctx context.Context, c *qemu.Config) (PrestartedVM, error)
}

// PrestartedVM is a VM waiting for its state (qemu.Prestart).
type PrestartedVM interface {
	VM
	Move(dir, id string) error
	Restore(ctx context.Context) error
}

// A pooled VM and what it was started for.
type pooled struct {
	vm  PrestartedVM
	key string
}

// startingQemu is the prestart in flight; a restore that claimed it
// takes pv once done is closed (nil: it failed).
type startingQemu struct {
	snapshot, key, dir string
	claimed, abandoned bool
	done               chan struct{}
	pv                 *pooled
}

// poolTemplate is what a snapshot's pooled qemus are started as.
type poolTemplate struct {
	config *qemu.Config // Dir and ID are a slot's
	disk   string       // the snapshot's disk, copied into each slot
}

type restorePool struct {
	cfg    RestorePool
	dir    string
	launch Prestarter
	log    *slog.Logger

	mu        sync.Mutex
	ready     map[string][]*pooled     // by snapshot
	templates map[string]*poolTemplate // by snapshot
	recent    []string                 // snapshots, most recent last
	stopped   bool
	starting  *startingQemu // the prestart in flight

	kick   chan struct{}
	done   chan struct{}
	filler sync.WaitGroup
	seq    atomic.Int64
	ctx    context.Context
	cancel context.CancelFunc
}

// ReadyFile marks a pooled qemu's directory once it waits to be taken.
const ReadyFile = "ready"

// PoolDir is where the pooled qemus' directories live, under the
// runtime's directory (the same filesystem as vms/, for the rename).
func PoolDir(runtimeDir string) string { return filepath.Join(runtimeDir, "pool") }

func newRestorePool(cfg RestorePool, runtimeDir string, launch Prestarter, log *slog.Logger) *restorePool {
	p := &restorePool{cfg: cfg, dir: PoolDir(runtimeDir), launch: launch, log: log, ready: map[string][]*pooled{},
		templates: map[string]*poolTemplate{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.filler.Add(1)
	go p.fill()
	return p
}

// clearPoolDir ends the qemus a daemon that did not stop cleanly left in
// the pool's directory and removes them; the links of taken ones (adopt)
// stay while their VM's directory is there.
func clearPoolDir(runtimeDir string, launch Launcher) {
	entries, _ := os.ReadDir(PoolDir(runtimeDir))
	for _, e := range entries {
		d := filepath.Join(PoolDir(runtimeDir), e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			if _, err := os.Stat(d); err != nil {
				_ = os.Remove(d) // its VM is gone
			}
			continue
		}
		launch.KillDir(d)
		_ = os.RemoveAll(d)
	}
}

// poolKey is a restore config's shape: everything but its name, its
// directory (disk paths taken relative to it), its niceness and its
// kernel command line (a restored guest never reads it again: it gets
// its hostname with its identity).
func poolKey(c *qemu.Config) string {
	k := *c
	k.ID, k.Dir, k.Nice, k.Cmdline, k.ExecDir = "", "", 0, "", ""
	k.Disks = slices.Clone(c.Disks)
	for i, d := range k.Disks {
		if rel, err := filepath.Rel(c.Dir, d.Path); err == nil && filepath.IsLocal(rel) {
			k.Disks[i].Path = "./" + rel
		}
	}
	b, _ := json.Marshal(k)
	return string(b)
}

// poolable tells whether a restore's config can come from the pool: no
// network card, and no disk but the VM's own copy of the snapshot's.
func poolable(c *qemu.Config, snapshotDisk string) bool {
	if c.Net != nil || c.Incoming == "" {
		return false
	}
	switch len(c.Disks) {
	case 0:
		return true
	case 1:
		return snapshotDisk != "" && c.Disks[0].Path == filepath.Join(c.Dir, "disk0.raw")
	}
	return false
}

// take hands out a pooled qemu for snapshot's restore config c, nil when
// none of its shape waits. When none waits but one is being started for
// it, the restore waits for that one (raised to the restore's CPU
// priority) rather than start a qemu of its own beside it: what the
// prestart has done already is not done twice, and the two do not share
// the CPU.
func (p *restorePool) take(ctx context.Context, snapshot string, c *qemu.Config) PrestartedVM {
	key := poolKey(c)
	p.mu.Lock()
	list := p.ready[snapshot]
	for i, pv := range list {
		if pv.key == key && pv.vm.Alive() {
			p.ready[snapshot] = slices.Delete(list, i, i+1)
			p.mu.Unlock()
			p.refill()
			return pv.vm
		}
	}
	f := p.starting
	if f == nil || f.snapshot != snapshot || f.key != key || f.claimed {
		p.mu.Unlock()
		if len(list) > 0 {
			p.log.Debug("restore pool: no qemu of this restore's shape", "snapshot", snapshot, "want", key, "have", list[0].key)
		}
		return nil
	}
	f.claimed = true
	p.mu.Unlock()
	p.refill()
	go raiseWhenStarted(f)
	select {
	case <-f.done:
	case <-ctx.Done():
		// Not taken after all: the filler ends it.
		p.mu.Lock()
		f.abandoned = true
		p.mu.Unlock()
		return nil
	}
	if f.pv == nil {
		return nil
	}
	return f.pv.vm
}

// refill has the filler start another qemu (at WarmNice, the prestart
// takes what CPU the restored guest leaves: the other core, on two).
func (p *restorePool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// raiseWhenStarted gives a prestart that a restore waits for the
// restore's CPU priority, once its qemu's pid is known.
func raiseWhenStarted(f *startingQemu) {
	for {
		if b, err := os.ReadFile(filepath.Join(f.dir, "qemu.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = setNice(pid, 0)
				return
			}
		}
		select {
		case <-f.done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// setNice sets the niceness of every thread of process pid.
func setNice(pid, nice int) error {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			_ = unix.Setpriority(unix.PRIO_PROCESS, tid, nice)
		}
	}
	return nil
}

// want records that snapshot is restored with config c (its disk copied
// from disk), making it the most recent, and has its pool refilled; the
// least recent snapshot beyond the bound loses its pool.
func (p *restorePool) want(snapshot string, c *qemu.Config, disk string) {
	if !poolable(c, disk) {
		return
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	key := poolKey(c)
	if t := p.templates[snapshot]; t == nil || poolKey(t.config) != key {
		tc := *c
		tc.Disks = slices.Clone(c.Disks)
		p.templates[snapshot] = &poolTemplate{config: &tc, disk: disk}
		// qemus of another shape are no use any more.
		var stale []*pooled
		p.ready[snapshot] = slices.DeleteFunc(p.ready[snapshot], func(pv *pooled) bool {
			if pv.key != key {
				stale = append(stale, pv)
				return true
			}
			return false
		})
		defer endPooled(stale)
	}
	p.recent = append(slices.DeleteFunc(p.recent, func(s string) bool { return s == snapshot }), snapshot)
	var evicted []*pooled
	for len(p.recent) > p.cfg.Snapshots {
		old := p.recent[0]
		p.recent = p.recent[1:]
		evicted = append(evicted, p.ready[old]...)
		delete(p.ready, old)
		delete(p.templates, old)
	}
	p.mu.Unlock()
	endPooled(evicted)
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// drop ends a snapshot's pooled qemus and forgets it (the snapshot is
// deleted).
func (p *restorePool) drop(snapshot string) {
	p.mu.Lock()
	list := p.ready[snapshot]
	delete(p.ready, snapshot)
	delete(p.templates, snapshot)
	p.recent = slices.DeleteFunc(p.recent, func(s string) bool { return s == snapshot })
	p.mu.Unlock()
	endPooled(list)
}

// endPooled kills pooled qemus and removes their directories.
func endPooled(list []*pooled) {
	for _, pv := range list {
		_ = pv.vm.Kill()
		_ = os.RemoveAll(pv.vm.Config().Dir)
	}
}

// fill keeps every recent snapshot's pool at its size, one prestart at a
// time, until close.
func (p *restorePool) fill() {
	defer p.filler.Done()
	for {
		select {
		case <-p.done:
			return
		case <-p.kick:
		}
		for {
			snapshot, t := p.next()
			if t == nil {
				break
			}
			f := &startingQemu{snapshot: snapshot, key: poolKey(t.config), done: make(chan struct{})}
			f.dir = p.slotDir()
			p.mu.Lock()
			p.starting = f
			p.mu.Unlock()
			pv, err := p.prestart(t, f.dir)
			p.mu.Lock()
			p.starting = nil
			if f.claimed {
				// A restore waits for this one: it is its.
				if err == nil && (f.abandoned || p.stopped) {
					endPooled([]*pooled{pv})
					pv = nil
				}
				f.pv = pv
				p.mu.Unlock()
				close(f.done)
				continue
			}
			close(f.done)
			switch {
			case err != nil:
				// Not again until the next restore asks for it.
				if p.templates[snapshot] == t {
					delete(p.templates, snapshot)
				}
				p.mu.Unlock()
				if p.ctx.Err() == nil {
					p.log.Warn("the restore pool could not start a qemu", "snapshot", snapshot, "error", err.Error())
				}
				continue
			case p.stopped || p.templates[snapshot] != t:
				p.mu.Unlock()
				endPooled([]*pooled{pv})
				continue
			}
			p.ready[snapshot] = append(p.ready[snapshot], pv)
			p.mu.Unlock()
			// For whoever looks at the node: this one waits to be taken.
			_ = os.WriteFile(filepath.Join(pv.vm.Config().Dir, ReadyFile), nil, 0o600)
		}
	}
}

// next is a snapshot whose pool is short, the most recent first.
func (p *restorePool) next() (string, *poolTemplate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return "", nil
	}
	for i := len(p.recent) - 1; i >= 0; i-- {
		s := p.recent[i]
		if t := p.templates[s]; t != nil && len(p.ready[s]) < p.cfg.Size {
			return s, t
		}
	}
	return "", nil
}

// PrestartTimeout bounds one pooled qemu's start (a loaded host is slow).
const PrestartTimeout = 30 * time.Second

// slotDir is a new pooled qemu's directory (never one used before: qemu
// removes its pid file by name when it ends).
func (p *restorePool) slotDir() string {
	return filepath.Join(p.dir, "pool-"+strconv.FormatInt(time.Now().UnixNano()%1e9, 36)+"-"+strconv.FormatInt(p.seq.Add(1), 36))
}

func (p *restorePool) prestart(t *poolTemplate, dir string) (*pooled, error) {
	ctx, cancel := context.WithTimeout(p.ctx, PrestartTimeout)
	defer cancel()
	c := *t.config
	c.ID, c.Dir = filepath.Base(dir), dir
	c.Nice = WarmNice // nobody waits for it
	c.Disks = slices.Clone(t.config.Disks)
	for i := range c.Disks {
		c.Disks[i].Path = filepath.Join(c.Dir, filepath.Base(c.Disks[i].Path))
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, err
	}
	if t.disk != "" {
		if err := copySparse(ctx, t.disk, filepath.Join(c.Dir, "disk0.raw")); err != nil {
			_ = os.RemoveAll(c.Dir)
			return nil, err
		}
	}
	vm, err := p.launch.Prestart(ctx, &c)
	if err != nil {
		_ = os.RemoveAll(c.Dir)
		return nil, err
	}
	return &pooled{vm: vm, key: poolKey(t.config)}, nil
}

// close ends every pooled qemu (and a prestart in flight) and removes
// the pool's directory.
func (p *restorePool) close() {
	p.mu.Lock()
	p.stopped = true
	var all []*pooled
	for _, list := range p.ready {
		all = append(all, list...)
	}
	p.ready = map[string][]*pooled{}
	p.mu.Unlock()
	p.cancel()
	close(p.done)
	p.filler.Wait()
	endPooled(all)
}

// count is how many pooled qemus wait (tests, logs).
func (p *restorePool) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, list := range p.ready {
		n += len(list)
	}
	return n
}
