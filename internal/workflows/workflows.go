// Package workflows implements the workflows group and the engine behind
// it: a workflow runs the steps of a rendered profile, one after the
// other, against one node through the node's bare-metal driver
// (internal/drivers). Each step is a row of workflow_steps with its state,
// attempts, timings, output and last error; the steps are a snapshot taken
// when the workflow starts.
//
//	running -> pausing (a step in flight) -> paused -> running (resume)
//	running -> succeeded | failed | aborted
//	failed  -> running (retry: from the failed step)
//	running, pausing, paused, failed -> aborted
//
// Workflows are started by other modules (Start, in their transaction);
// the Job runs them under a singleton lease. A step in flight when its
// worker dies is started again by the next holder of the lease, so every
// action is written to be idempotent. See docs/workflows.md.
package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/wire"
	"computeplane/internal/workflows/actionspec"
)

// States of a workflow.
const (
	StateRunning   = "running"
	StatePausing   = "pausing"
	StatePaused    = "paused"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateAborted   = "aborted"
)

// States of a step.
const (
	StepPending   = "pending"
	StepRunning   = "running"
	StepSucceeded = "succeeded"
	StepFailed    = "failed"
	StepAborted   = "aborted"
)

// TopicJob wakes the workflow job (a workflow started, resumed or
// retried).
const TopicJob = "workflows"

// Service implements api.WorkflowsService.
type Service struct{}

var _ api.WorkflowsService = Service{}

// StartParams start a workflow.
type StartParams struct {
	TenantID       string // whose profiles are looked up: the node's owner
	NodeID         string
	ProfileID      string
	ProfileVersion int // 0: the latest
	Inputs         map[string]any
	StartedBy      string
}

// Profiles renders profiles for Start; the host sets it to the profiles
// group behind the module's built-in ones.
var Profiles Renderer = Builtin{}

// ProfileLocker makes a profile version immutable at start; nil locks
// nothing (builtin profiles are immutable anyway).
var ProfileLocker Locker

// Start renders the profile and writes the workflow with its steps and
// workflow.started in tx; the job picks it up after commit (wake it with
// the notifier topic TopicJob). A node with a live workflow is
// CONFLICT.
func Start(ctx context.Context, tx pgx.Tx, p StartParams) (*api.Workflow, error) {
	q := db.New(tx)
	owner, err := q.WorkflowNodeOwner(ctx, p.NodeID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeNotFound, "nodeId: node %s not found", p.NodeID)
	}
	if err != nil {
		return nil, err
	}
	r, err := Profiles.Render(ctx, tx, p.TenantID, p.ProfileID, p.ProfileVersion)
	if err != nil {
		return nil, err
	}
	if len(r.Steps) == 0 {
		return nil, api.Errorf(api.CodeInvalidInput, "profileId: profile %s version %d has no steps", r.ID, r.Version)
	}
	inputs := p.Inputs
	if inputs == nil {
		inputs = map[string]any{}
	}
	rawInputs, err := json.Marshal(inputs)
	if err != nil {
		return nil, err
	}
	if ProfileLocker != nil && r.Tenant != BuiltinTenant {
		if err := ProfileLocker.Lock(ctx, tx, r.Tenant, r.ID, r.Version); err != nil {
			return nil, err
		}
	}
	w, err := q.InsertWorkflow(ctx, db.InsertWorkflowParams{
		WorkflowID: ids.New("wf"), TenantID: owner.TenantID, NodeID: p.NodeID, ProfileTenant: r.Tenant, ProfileID: r.ID,
		ProfileVersion: int32(r.Version), Inputs: rawInputs, StartedBy: p.StartedBy,
	})
	if isUnique(err) {
		return nil, api.Errorf(api.CodeConflict, "nodeId: node %s has a workflow running", p.NodeID)
	}
	if err != nil {
		return nil, err
	}
	for i, s := range r.Steps {
		with, err := substitute(s, inputs)
		if err != nil {
			return nil, api.Errorf(api.CodeInvalidInput, "inputs: %s", err.Error())
		}
		if _, ok := Actions[s.Uses]; !ok {
			return nil, api.Errorf(api.CodeInvalidInput, "profileId: step %s uses %q, which is not a built-in action", s.Name, s.Uses)
		}
		if issues, ok := actionspec.Check(s.Uses, with); ok && len(issues) > 0 {
			return nil, api.Errorf(api.CodeInvalidInput, "inputs: step %s: with.%s %s", s.Name, issues[0].Path, issues[0].Message)
		}
		rawWith, err := json.Marshal(with)
		if err != nil {
			return nil, err
		}
		timeout := s.TimeoutMs
		if timeout <= 0 {
			timeout = DefaultStepTimeout.Milliseconds()
		}
		if err := q.InsertWorkflowStep(ctx, db.InsertWorkflowStepParams{WorkflowID: w.WorkflowID, Position: int32(i), Name: s.Name,
			Phase: s.Phase, Action: s.Uses, Inputs: rawWith, TimeoutMs: timeout, Retries: int32(max(s.Retries, 0))}); err != nil {
			return nil, err
		}
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventWorkflowStarted, Subject: w.WorkflowID, TenantID: w.TenantID,
		Data: api.WorkflowStartedPayload{WorkflowID: w.WorkflowID, NodeID: w.NodeID, ProfileID: w.ProfileID, ProfileVersion: int64(w.ProfileVersion)}}); err != nil {
		return nil, err
	}
	wake(ctx)
	return load(ctx, q, w)
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// Output is the workflow as the API shows it.
func Output(w db.Workflow, steps []db.WorkflowStep) *api.Workflow {
	out := &api.Workflow{WorkflowID: w.WorkflowID, TenantID: w.TenantID, NodeID: w.NodeID, ProfileID: w.ProfileID,
		ProfileVersion: int64(w.ProfileVersion), State: w.State, Steps: make([]api.WorkflowStep, 0, len(steps)),
		Version: int64(w.Version), CreatedAt: wire.Time(w.CreatedAt), UpdatedAt: wire.Time(w.UpdatedAt)}
	if w.Error.Valid {
		out.Error = &w.Error.String
	}
	if w.FinishedAt != nil {
		s := wire.Time(*w.FinishedAt)
		out.FinishedAt = &s
	}
	for _, s := range steps {
		st := api.WorkflowStep{Position: int64(s.Position), Name: s.Name, Phase: s.Phase, Uses: s.Action, With: map[string]any{},
			TimeoutMs: s.TimeoutMs, Retries: int64(s.Retries), State: s.State, Attempts: int64(s.Attempts)}
		_ = json.Unmarshal(s.Inputs, &st.With)
		if s.StartedAt != nil {
			t := wire.Time(*s.StartedAt)
			st.StartedAt = &t
		}
		if s.FinishedAt != nil {
			t := wire.Time(*s.FinishedAt)
			st.FinishedAt = &t
			if s.StartedAt != nil {
				d := s.FinishedAt.Sub(*s.StartedAt).Milliseconds()
				st.DurationMs = &d
			}
		}
		if s.Output != nil {
			_ = json.Unmarshal(s.Output, &st.Output)
		}
		if s.LastError.Valid {
			st.LastError = &s.LastError.String
		}
		if out.CurrentStep == nil && s.State != StepSucceeded {
			name := s.Name
			out.CurrentStep = &name
		}
		out.Steps = append(out.Steps, st)
	}
	return out
}

func load(ctx context.Context, q *db.Queries, w db.Workflow) (*api.Workflow, error) {
	steps, err := q.WorkflowSteps(ctx, w.WorkflowID)
	if err != nil {
		return nil, err
	}
	return Output(w, steps), nil
}

func notFound(id string) error {
	return api.Errorf(api.CodeNotFound, "workflowId: workflow %s not found", id)
}

// node checks that the node belongs to a pool of tenant (else NOT_FOUND).
func node(ctx context.Context, q *db.Queries, tenant, nodeID string) error {
	o, err := q.WorkflowNodeOwner(ctx, nodeID)
	_, err = store.Visible(o, err, o.TenantID == tenant, api.Errorf(api.CodeNotFound, "nodeId: node %s not found", nodeID))
	return err
}

func get(ctx context.Context, q *db.Queries, tenant, nodeID, id string, forUpdate bool) (db.Workflow, error) {
	if err := node(ctx, q, tenant, nodeID); err != nil {
		return db.Workflow{}, err
	}
	var w db.Workflow
	var err error
	if forUpdate {
		w, err = q.GetWorkflowForUpdate(ctx, id)
	} else {
		w, err = q.GetWorkflow(ctx, id)
	}
	return store.Visible(w, err, w.NodeID == nodeID, notFound(id))
}

// Get answers workflows.get.
func (Service) Get(ctx context.Context, in *api.WorkflowsGetInput) (*api.Workflow, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	w, err := get(ctx, q, in.TenantID, in.NodeID, in.WorkflowID, false)
	if err != nil {
		return nil, err
	}
	return load(ctx, q, w)
}

// List answers workflows.list.
func (Service) List(ctx context.Context, in *api.WorkflowsListInput) (*api.WorkflowList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if err := node(ctx, q, in.TenantID, in.NodeID); err != nil {
		return nil, err
	}
	rows, err := q.ListNodeWorkflows(ctx, db.ListNodeWorkflowsParams{NodeID: in.NodeID, MaxRows: 100})
	if err != nil {
		return nil, err
	}
	idList := make([]string, 0, len(rows))
	for _, w := range rows {
		idList = append(idList, w.WorkflowID)
	}
	steps, err := q.StepsOfWorkflows(ctx, idList)
	if err != nil {
		return nil, err
	}
	by := map[string][]db.WorkflowStep{}
	for _, s := range steps {
		by[s.WorkflowID] = append(by[s.WorkflowID], s)
	}
	out := &api.WorkflowList{Items: []api.Workflow{}}
	for _, w := range rows {
		if in.State != nil && w.State != *in.State {
			continue
		}
		out.Items = append(out.Items, *Output(w, by[w.WorkflowID]))
	}
	return out, nil
}

// Abort answers workflows.abort.
func (Service) Abort(ctx context.Context, in *api.WorkflowsAbortInput) (*api.Workflow, error) {
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	w, err := get(ctx, q, in.TenantID, in.NodeID, in.WorkflowID, true)
	if err != nil {
		return nil, err
	}
	switch w.State {
	case StateAborted:
		return load(ctx, q, w)
	case StateSucceeded:
		return nil, api.Errorf(api.CodeInvalidState, "workflowId: workflow %s succeeded; there is nothing to abort", w.WorkflowID)
	}
	msg := "aborted"
	if in.Reason != nil && *in.Reason != "" {
		msg = "aborted: " + *in.Reason
	}
	if err := q.AbortWorkflowSteps(ctx, w.WorkflowID); err != nil {
		return nil, err
	}
	w, err = setState(ctx, q, w.WorkflowID, StateAborted, msg)
	if err != nil {
		return nil, err
	}
	if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventWorkflowAborted, Subject: w.WorkflowID, TenantID: w.TenantID,
		Data: api.WorkflowAbortedPayload{WorkflowID: w.WorkflowID, NodeID: w.NodeID}}); err != nil {
		return nil, err
	}
	return load(ctx, q, w)
}

// Retry answers workflows.retry: the failed step runs again with a fresh
// retry budget; the steps before it keep their results.
func (Service) Retry(ctx context.Context, in *api.WorkflowsRetryInput) (*api.Workflow, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	w, err := get(ctx, q, in.TenantID, in.NodeID, in.WorkflowID, true)
	if err != nil {
		return nil, err
	}
	if w.State != StateFailed {
		return nil, api.Errorf(api.CodeInvalidState, "workflowId: workflow %s is %s; only a failed workflow is retried", w.WorkflowID, w.State)
	}
	if live, err := q.LiveNodeWorkflow(ctx, w.NodeID); err == nil {
		return nil, api.Errorf(api.CodeConflict, "nodeId: workflow %s runs on node %s", live.WorkflowID, w.NodeID)
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	steps, err := q.WorkflowSteps(ctx, w.WorkflowID)
	if err != nil {
		return nil, err
	}
	for _, s := range steps {
		if s.State == StepFailed {
			if err := q.ResetWorkflowStep(ctx, db.ResetWorkflowStepParams{WorkflowID: w.WorkflowID, Position: s.Position}); err != nil {
				return nil, err
			}
		}
	}
	if w, err = setState(ctx, q, w.WorkflowID, StateRunning, ""); err != nil {
		return nil, err
	}
	wake(ctx)
	return load(ctx, q, w)
}

// Pause answers workflows.pause.
func (Service) Pause(ctx context.Context, in *api.WorkflowsPauseInput) (*api.Workflow, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	w, err := get(ctx, q, in.TenantID, in.NodeID, in.WorkflowID, true)
	if err != nil {
		return nil, err
	}
	switch w.State {
	case StatePausing, StatePaused:
		return load(ctx, q, w)
	case StateRunning:
	default:
		return nil, api.Errorf(api.CodeInvalidState, "workflowId: workflow %s is %s; only a running workflow pauses", w.WorkflowID, w.State)
	}
	steps, err := q.WorkflowSteps(ctx, w.WorkflowID)
	if err != nil {
		return nil, err
	}
	next := StatePaused
	for _, s := range steps {
		if s.State == StepRunning {
			next = StatePausing
		}
	}
	if w, err = setState(ctx, q, w.WorkflowID, next, ""); err != nil {
		return nil, err
	}
	return load(ctx, q, w)
}

// Resume answers workflows.resume.
func (Service) Resume(ctx context.Context, in *api.WorkflowsResumeInput) (*api.Workflow, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	w, err := get(ctx, q, in.TenantID, in.NodeID, in.WorkflowID, true)
	if err != nil {
		return nil, err
	}
	switch w.State {
	case StateRunning:
		return load(ctx, q, w)
	case StatePausing, StatePaused:
	default:
		return nil, api.Errorf(api.CodeInvalidState, "workflowId: workflow %s is %s; only a paused workflow resumes", w.WorkflowID, w.State)
	}
	if w, err = setState(ctx, q, w.WorkflowID, StateRunning, ""); err != nil {
		return nil, err
	}
	wake(ctx)
	return load(ctx, q, w)
}

func setState(ctx context.Context, q *db.Queries, id, state, msg string) (db.Workflow, error) {
	p := db.SetWorkflowStateParams{WorkflowID: id, State: state}
	if msg != "" {
		p.Error.String, p.Error.Valid = msg, true
	}
	w, err := q.SetWorkflowState(ctx, p)
	if err != nil {
		return w, fmt.Errorf("workflows: %s: %w", id, err)
	}
	return w, nil
}

// wake asks for the job to be woken after the commit; a missed wake costs
// one poll period.
func wake(ctx context.Context) { notify.Later(ctx, TopicJob) }
