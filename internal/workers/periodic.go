package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/internal/notify"
	"computeplane/internal/uow"
)

// Fence checks, inside a transaction, that the work may still write: a
// lease's Fence (tests give one that checks nothing).
type Fence = func(ctx context.Context, tx pgx.Tx) error

// Periodic is a singleton job made of passes, the one way to write a
// background job (docs: CONTRIBUTING.md, "Adding a background job"): a pass
// at once, then one every Interval, or as soon as Wake is woken. Each pass
// runs under PassTimeout and writes through Tx, fenced by the job's lease.
type Periodic struct {
	// Name is the job's name: its lease is job/<Name>.
	Name string
	// Interval is the time between passes when nothing woke the job.
	Interval time.Duration
	// Wake is a notifier topic whose wake-up starts a pass at once; ""
	// (or no Notifier) passes at Interval only.
	Wake string
	// PassTimeout bounds one pass; 0 leaves the bounds to the pass (one
	// that calls providers bounds each call).
	PassTimeout time.Duration
	// Backoff makes a failed pass end the run, so that the runner backs
	// off (1 s doubling to 5 min) before running the job again; without
	// it a failure is logged and the next pass comes at Interval.
	Backoff bool
	// Pass is one pass; every write it makes is fenced by fence.
	Pass func(ctx context.Context, fence Fence) error
	// Drain, when set, is called as the run ends, before Run returns: a
	// job whose passes start work that outlives them waits for it there,
	// so that the next holder of the lease never overlaps with it.
	Drain func()
	// Start, when set, runs once as the run begins, before the first
	// pass (a job that takes over from an earlier lease holder tidies
	// what it left); a failure is logged.
	Start func(ctx context.Context, fence Fence) error
	// Also are wake-ups beside Wake that are not notifier topics (work
	// the job itself frees, a caller's channel).
	Also []<-chan struct{}
	// Next, when set, chooses the wait after each pass (at most
	// Interval), for a job that rechecks sooner while work is held back;
	// without it passes come every Interval.
	Next     func() time.Duration
	Notifier *notify.Notifier
	Log      *slog.Logger

	mu      sync.Mutex
	signals chan error
}

// Validate reports a Periodic that cannot run.
func (p *Periodic) Validate() error {
	switch {
	case p.Name == "":
		return errors.New("workers: a periodic job needs a Name")
	case p.Interval <= 0:
		return fmt.Errorf("workers: periodic job %s: Interval must be positive", p.Name)
	case p.PassTimeout < 0:
		return fmt.Errorf("workers: periodic job %s: PassTimeout must not be negative", p.Name)
	case p.Pass == nil:
		return fmt.Errorf("workers: periodic job %s has no Pass", p.Name)
	case len(p.Also) > 2:
		return fmt.Errorf("workers: periodic job %s: at most 2 Also channels", p.Name)
	}
	return nil
}

// RegisterPeriodic adds p as a singleton job (RegisterSingleton); it panics
// on a p that does not validate.
func (r *Runner) RegisterPeriodic(p *Periodic) {
	if err := p.Validate(); err != nil {
		panic(err.Error())
	}
	r.RegisterSingleton(p.Name, p.Run)
}

// Run is the job (a JobFunc): passes until ctx ends, each fenced by l.
func (p *Periodic) Run(ctx context.Context, l Lease) error { return p.RunFenced(ctx, l.Fence) }

// RunFenced runs passes until ctx ends, their writes fenced by fence (nil:
// unfenced, for tests).
func (p *Periodic) RunFenced(ctx context.Context, fence Fence) error {
	if p.Drain != nil {
		defer p.Drain()
	}
	var wake <-chan struct{}
	if p.Wake != "" && p.Notifier != nil {
		ch, stop := p.Notifier.Subscribe(p.Wake)
		defer stop()
		wake = ch
	}
	also := make([]<-chan struct{}, 2) // nil channels never fire
	copy(also, p.Also)
	if p.Start != nil {
		if err := p.Start(ctx, fence); err != nil && ctx.Err() == nil {
			p.logger().Warn("job start failed", "job", p.Name, "error", err.Error())
		}
	}
	t := time.NewTimer(p.Interval)
	defer t.Stop()
	for {
		if err := p.RunOnce(ctx, fence); err != nil && ctx.Err() == nil {
			if p.Backoff {
				return err
			}
			p.logger().Warn("job pass failed", "job", p.Name, "error", err.Error())
		}
		next := p.Interval
		if p.Next != nil {
			next = min(max(p.Next(), 0), p.Interval)
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-also[0]:
		case <-also[1]:
		case <-t.C:
		}
	}
}

// RunOnce runs one pass under PassTimeout.
func (p *Periodic) RunOnce(ctx context.Context, fence Fence) error {
	if p.PassTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.PassTimeout)
		defer cancel()
	}
	err := p.Pass(ctx, fence)
	p.signal(err)
	return err
}

// TestSignals returns a channel that receives the outcome of every pass
// from now on (a buffer of 16; outcomes that find it full are dropped), so
// that a test waits for a pass rather than sleeping.
func (p *Periodic) TestSignals() <-chan error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.signals == nil {
		p.signals = make(chan error, 16)
	}
	return p.signals
}

func (p *Periodic) signal(err error) {
	p.mu.Lock()
	ch := p.signals
	p.mu.Unlock()
	if ch != nil {
		select {
		case ch <- err:
		default:
		}
	}
}

func (p *Periodic) logger() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.Default()
}

// Tx is a job's write: fn runs as one unit of work (uow.Run) in a
// transaction of st fenced by fence (nil: unfenced), and once it has
// committed Tx wakes the topics the unit asked for (notify.Later) and,
// when it wrote events, the outbox's readers. n nil wakes nothing.
func Tx(ctx context.Context, st uow.Transactor, n *notify.Notifier, fence Fence, fn func(ctx context.Context, tx pgx.Tx) error) error {
	u, err := uow.Run(ctx, st, false, func(ctx context.Context, u *uow.Unit) error {
		if fence != nil {
			if err := fence(ctx, u.Tx); err != nil {
				return err
			}
		}
		return fn(ctx, u.Tx)
	})
	if err != nil || n == nil {
		return err
	}
	n.WakeUnit(u)
	if u.Wrote() {
		n.Wake(notify.TopicOutbox)
	}
	return nil
}
