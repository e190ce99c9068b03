package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/drivers"
	"computeplane/internal/images"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/workers"
)

// JobName is the singleton job that runs workflows.
const JobName = "workflows"

// Defaults of the job.
const (
	JobEvery           = 500 * time.Millisecond // a look for runnable workflows when nothing woke the job
	DefaultStepTimeout = 5 * time.Minute
	DefaultConcurrency = 16
	// RetryBackoff is the delay before the n-th retry of a step: 1 s
	// doubling, at most MaxRetryBackoff.
	RetryBackoff    = time.Second
	MaxRetryBackoff = 30 * time.Second
	// abortPoll is how often a running step checks that its workflow was
	// not aborted meanwhile.
	abortPoll = 500 * time.Millisecond
)

// Job runs the steps of running workflows, each workflow in a goroutine of
// its own, under one lease; every write is fenced by it.
type Job struct {
	Store       *store.Store
	Notifier    *notify.Notifier
	Drivers     drivers.Registry
	Images      images.Source
	Concurrency int
	Log         *slog.Logger

	mu      sync.Mutex
	running map[string]bool
}

// Periodic is the job: every JobEvery, or at once when woken (TopicJob),
// a pass starts a goroutine for each runnable workflow not yet driven, up
// to Concurrency; as the lease goes, the run waits for them.
func (j *Job) Periodic() *workers.Periodic {
	if j.Log == nil {
		j.Log = slog.Default()
	}
	conc := j.Concurrency
	if conc <= 0 {
		conc = DefaultConcurrency
	}
	j.mu.Lock()
	j.running = map[string]bool{}
	j.mu.Unlock()
	var wg sync.WaitGroup
	return &workers.Periodic{Name: JobName, Interval: JobEvery, Wake: TopicJob, Notifier: j.Notifier, Log: j.Log, Drain: wg.Wait,
		Pass: func(ctx context.Context, fence workers.Fence) error {
			ids, err := j.Store.Queries().RunnableWorkflows(ctx, int32(conc*2))
			for _, id := range ids {
				j.mu.Lock()
				busy := j.running[id] || len(j.running) >= conc
				if !busy {
					j.running[id] = true
				}
				j.mu.Unlock()
				if busy {
					continue
				}
				wg.Go(func() {
					defer func() {
						j.mu.Lock()
						delete(j.running, id)
						j.mu.Unlock()
					}()
					j.drive(ctx, fence, id)
				})
			}
			return err
		}}
}

// drive runs the steps of one workflow until it finishes, pauses, waits
// for a retry or the lease goes.
func (j *Job) drive(ctx context.Context, fence workers.Fence, id string) {
	for ctx.Err() == nil {
		more, err := j.Step(ctx, fence, id)
		if err != nil {
			if ctx.Err() == nil {
				j.Log.Warn("workflows: step", "workflow", id, "error", err.Error())
			}
			return
		}
		if !more {
			return
		}
	}
}

type fenceFunc = workers.Fence

// tx is one write of the job, bounded to 10 s (workers.Tx: fenced, the
// outbox's readers woken after it wrote events).
func (j *Job) tx(ctx context.Context, fence fenceFunc, fn func(ctx context.Context, tx pgx.Tx, q *db.Queries) error) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return workers.Tx(wctx, j.Store, j.Notifier, fence, func(ctx context.Context, tx pgx.Tx) error {
		return fn(ctx, tx, db.New(tx))
	})
}

// Step runs the next step of workflow id, from its start to its recorded
// end; more says whether another step can follow at once.
func (j *Job) Step(ctx context.Context, fence fenceFunc, id string) (more bool, err error) {
	if j.Log == nil {
		j.Log = slog.Default()
	}
	var w db.Workflow
	var step db.WorkflowStep
	var last bool
	run := false
	err = j.tx(ctx, fence, func(ctx context.Context, tx pgx.Tx, q *db.Queries) error {
		var err error
		w, err = q.GetWorkflowForUpdate(ctx, id)
		if err != nil {
			return err
		}
		if w.State != StateRunning && w.State != StatePausing {
			return nil
		}
		now, err := q.WorkflowClock(ctx)
		if err != nil {
			return err
		}
		if w.NotBefore != nil && w.NotBefore.After(now) {
			return nil
		}
		steps, err := q.WorkflowSteps(ctx, id)
		if err != nil {
			return err
		}
		i := 0
		for i < len(steps) && steps[i].State == StepSucceeded {
			i++
		}
		if i == len(steps) {
			// Every step succeeded but the workflow was not closed.
			return j.succeed(ctx, tx, w)
		}
		step, last = steps[i], i == len(steps)-1
		switch {
		case step.State == StepPending && w.State == StatePausing:
			_, err := setState(ctx, q, id, StatePaused, "")
			return err
		case step.State != StepPending && step.State != StepRunning:
			return nil // failed or aborted: the workflow's state says so
		}
		// A step found running was interrupted (its worker died): it
		// starts again, as every action is idempotent.
		step, err = q.StartWorkflowStep(ctx, db.StartWorkflowStepParams{WorkflowID: id, Position: step.Position})
		run = err == nil
		return err
	})
	if err != nil || !run {
		return false, err
	}
	out, actErr := j.execute(ctx, fence, w, step)
	if ctx.Err() != nil {
		// The lease went or the worker stops: the step stays running and
		// the next holder starts it again.
		return false, ctx.Err()
	}
	err = j.tx(ctx, fence, func(ctx context.Context, tx pgx.Tx, q *db.Queries) error {
		w, err = q.GetWorkflowForUpdate(ctx, id)
		if err != nil {
			return err
		}
		cur, err := q.WorkflowSteps(ctx, id)
		if err != nil {
			return err
		}
		s := cur[step.Position]
		if s.State != StepRunning || s.Attempts != step.Attempts || (w.State != StateRunning && w.State != StatePausing) {
			return nil // aborted meanwhile
		}
		dur := int64(0)
		if s.StartedAt != nil {
			now, err := q.WorkflowClock(ctx)
			if err != nil {
				return err
			}
			dur = now.Sub(*s.StartedAt).Milliseconds()
		}
		if actErr == nil {
			raw, err := json.Marshal(out)
			if err != nil {
				return err
			}
			if _, err := q.FinishWorkflowStep(ctx, db.FinishWorkflowStepParams{WorkflowID: id, Position: s.Position, State: StepSucceeded, Output: raw}); err != nil {
				return err
			}
			if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventWorkflowStepSucceeded, Subject: id, TenantID: w.TenantID,
				Data: api.WorkflowStepSucceededPayload{WorkflowID: id, NodeID: w.NodeID, Step: s.Name, Position: int64(s.Position),
					Attempt: int64(s.Attempts), DurationMs: dur}}); err != nil {
				return err
			}
			switch {
			case last:
				return j.succeed(ctx, tx, w)
			case w.State == StatePausing:
				_, err := setState(ctx, q, id, StatePaused, "")
				return err
			}
			more = true
			return nil
		}
		msg := actErr.Error()
		if len(msg) > 4000 {
			msg = msg[:4000]
		}
		msg = strings.ToValidUTF8(msg, "?")
		retry := int(s.Failures)+1 <= int(s.Retries)
		state := StepFailed
		if retry {
			state = StepPending
		}
		p := db.FinishWorkflowStepParams{WorkflowID: id, Position: s.Position, State: state, Failed: 1}
		p.LastError.String, p.LastError.Valid = msg, true
		if _, err := q.FinishWorkflowStep(ctx, p); err != nil {
			return err
		}
		if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventWorkflowStepFailed, Subject: id, TenantID: w.TenantID,
			Data: api.WorkflowStepFailedPayload{WorkflowID: id, NodeID: w.NodeID, Step: s.Name, Position: int64(s.Position),
				Attempt: int64(s.Attempts), Error: msg, WillRetry: retry}}); err != nil {
			return err
		}
		if retry {
			now, err := q.WorkflowClock(ctx)
			if err != nil {
				return err
			}
			next := now.Add(backoff(int(s.Failures) + 1))
			_, err = q.SetWorkflowState(ctx, db.SetWorkflowStateParams{WorkflowID: id, State: w.State, NotBefore: &next,
				Error: w.Error})
			return err
		}
		if _, err := setState(ctx, q, id, StateFailed, fmt.Sprintf("step %s: %s", s.Name, msg)); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, outbox.Event{Type: api.EventWorkflowFailed, Subject: id, TenantID: w.TenantID,
			Data: api.WorkflowFailedPayload{WorkflowID: id, NodeID: w.NodeID, Step: s.Name, Error: msg}})
	})
	return more && err == nil, err
}

func backoff(n int) time.Duration {
	d := RetryBackoff
	for i := 1; i < n && d < MaxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, MaxRetryBackoff)
}

func (j *Job) succeed(ctx context.Context, tx pgx.Tx, w db.Workflow) error {
	w, err := setState(ctx, db.New(tx), w.WorkflowID, StateSucceeded, "")
	if err != nil {
		return err
	}
	return outbox.Write(ctx, tx, outbox.Event{Type: api.EventWorkflowSucceeded, Subject: w.WorkflowID, TenantID: w.TenantID,
		Data: api.WorkflowSucceededPayload{WorkflowID: w.WorkflowID, NodeID: w.NodeID}})
}

// execute runs the step's action bounded by its timeout, cancelled when
// the workflow is aborted meanwhile.
func (j *Job) execute(ctx context.Context, fence fenceFunc, w db.Workflow, s db.WorkflowStep) (map[string]any, error) {
	act, ok := Actions[s.Action]
	if !ok {
		return nil, fmt.Errorf("no action %q", s.Action)
	}
	with := map[string]any{}
	if err := json.Unmarshal(s.Inputs, &with); err != nil {
		return nil, err
	}
	inputs := map[string]any{}
	_ = json.Unmarshal(w.Inputs, &inputs)
	timeout := time.Duration(s.TimeoutMs) * time.Millisecond
	sctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("step %s timed out after %s", s.Name, timeout))
	defer cancel()
	go j.watchAbort(sctx, cancel, w.WorkflowID)
	env := &Env{Job: j, WorkflowID: w.WorkflowID, NodeID: w.NodeID, TenantID: w.TenantID, Step: s.Name, Attempt: int(s.Attempts),
		Inputs: inputs, Images: j.Images, fence: fence, Log: j.Log.With("workflow", w.WorkflowID, "step", s.Name)}
	defer env.close()
	out, err := act(sctx, env, with)
	if err != nil && sctx.Err() != nil && ctx.Err() == nil {
		if cause := context.Cause(sctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return nil, cause
		}
	}
	if out == nil {
		out = map[string]any{}
	}
	return out, err
}

func (j *Job) watchAbort(ctx context.Context, cancel context.CancelFunc, id string) {
	t := time.NewTicker(abortPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w, err := j.Store.Queries().GetWorkflow(ctx, id)
		if err == nil && w.State == StateAborted {
			cancel()
			return
		}
	}
}
