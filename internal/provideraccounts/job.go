package provideraccounts

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/join"
	"computeplane/internal/nodes"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/providers"
	"computeplane/internal/store"
	"computeplane/internal/workers"
)

// JobName is the singleton job that drives bootstraps.
const JobName = "provider-bootstraps"

// Reconciler timing.
var (
	JobEvery    = 500 * time.Millisecond
	JoinTimeout = 10 * time.Minute // installed to ready
	MaxAttempts = 5                // failed provider calls before a bootstrap fails
	MaxBackoff  = 5 * time.Minute
)

// Job is the bootstrap reconciler: it moves each bootstrap in flight one
// step per pass. Provider calls (identify, claim, install) are made outside
// any transaction; what they found is written in a transaction fenced by
// the job's lease, so a process that lost the lease writes nothing.
type Job struct {
	Service *Service
	Store   *store.Store
	// Notifier, when set, wakes the outbox's readers after a write of
	// events.
	Notifier *notify.Notifier
	Log      *slog.Logger
}

// Periodic is the job: a pass every JobEvery. A pass has no overall
// bound: its provider calls bound themselves.
func (j *Job) Periodic() *workers.Periodic {
	return &workers.Periodic{Name: JobName, Interval: JobEvery, Pass: j.Pass, Log: j.Log}
}

// Pass moves every due bootstrap one step.
func (j *Job) Pass(ctx context.Context, fence workers.Fence) error {
	rows, err := db.New(j.Store.Pool()).DueProviderBootstraps(ctx, 16)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range rows {
		if err := j.step(ctx, fence, r); err != nil {
			errs = append(errs, fmt.Errorf("bootstrap %s: %w", r.BootstrapID, err))
		}
	}
	return errors.Join(errs...)
}

// save writes r (and events) under the lease; it reports whether the
// bootstrap was still as read (another step did not move it).
func (j *Job) save(ctx context.Context, fence workers.Fence, r db.ProviderBootstrap, events ...outbox.Event) error {
	return writeFenced(ctx, j.Store, j.Notifier, fence, func(q *db.Queries) ([]outbox.Event, error) {
		_, err := q.SaveProviderBootstrap(ctx, saveParams(r))
		return events, err
	})
}

// writeFenced runs change in a transaction fenced by the job's lease
// (workers.Tx) and writes the events it returns; n (when set) wakes the
// outbox's readers after a commit that wrote events.
func writeFenced(ctx context.Context, st *store.Store, n *notify.Notifier, fence workers.Fence,
	change func(q *db.Queries) ([]outbox.Event, error)) error {
	return workers.Tx(ctx, st, n, fence, func(ctx context.Context, tx pgx.Tx) error {
		events, err := change(db.New(tx))
		if err != nil {
			return err
		}
		for _, e := range events {
			if err := outbox.Write(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// backoff is the wait before the next try after attempts failed provider
// calls: 1 s doubling, at most MaxBackoff.
func backoff(attempts int32) time.Duration {
	return min(time.Second<<(attempts-1), MaxBackoff)
}

func saveParams(r db.ProviderBootstrap) db.SaveProviderBootstrapParams {
	return db.SaveProviderBootstrapParams{BootstrapID: r.BootstrapID, State: r.State, MachineID: r.MachineID, Claimed: r.Claimed,
		TokenID: r.TokenID, NodeID: r.NodeID, Error: r.Error, Attempts: r.Attempts, NextAttemptAt: r.NextAttemptAt,
		MachineAt: r.MachineAt, InstalledAt: r.InstalledAt, FinishedAt: r.FinishedAt}
}

func str(s string) pgtype.Text { return pgtype.Text{String: s, Valid: true} }

func ptr(p pgtype.Text) *string {
	if !p.Valid {
		return nil
	}
	return &p.String
}

// retry records a failed attempt: again after a backoff, or failed after
// MaxAttempts.
func (j *Job) retry(ctx context.Context, fence workers.Fence, r db.ProviderBootstrap, cause error) error {
	r.Attempts++
	if int(r.Attempts) >= MaxAttempts {
		return j.fail(ctx, fence, r, fmt.Sprintf("%s (after %d attempts)", cause.Error(), r.Attempts))
	}
	r.Error = str(cause.Error())
	r.NextAttemptAt = time.Now().Add(backoff(r.Attempts))
	j.Log.Info("provider bootstrap attempt failed", "bootstrapId", r.BootstrapID, "state", r.State, "attempt", r.Attempts, "error", cause.Error())
	return j.save(ctx, fence, r)
}

// fail ends a bootstrap: failed, its unused token revoked, and a machine
// it claimed released (after the commit; best effort).
func (j *Job) fail(ctx context.Context, fence workers.Fence, r db.ProviderBootstrap, why string) error {
	now := time.Now()
	r.State, r.Error, r.FinishedAt = StateFailed, str(why), &now
	err := writeFenced(ctx, j.Store, j.Notifier, fence, func(q *db.Queries) ([]outbox.Event, error) {
		if _, err := q.SaveProviderBootstrap(ctx, saveParams(r)); err != nil {
			return nil, err
		}
		if r.TokenID.Valid {
			if err := q.RevokeJoinToken(ctx, r.TokenID.String); err != nil {
				return nil, err
			}
		}
		return []outbox.Event{{Type: api.EventProviderBootstrapFailed, Subject: r.AccountID, TenantID: r.TenantID,
			Data: api.ProviderBootstrapFailedPayload{AccountID: r.AccountID, PoolID: r.PoolID, MachineID: ptr(r.MachineID), OfferID: ptr(r.OfferID), Error: why}}}, nil
	})
	if err != nil {
		return err
	}
	j.Log.Warn("provider bootstrap failed", "bootstrapId", r.BootstrapID, "error", why)
	if r.Claimed && r.MachineID.Valid {
		if acct, aerr := db.New(j.Store.Pool()).GetProviderAccount(ctx, r.AccountID); aerr == nil {
			if p, perr := j.Service.client(acct); perr == nil {
				if rerr := p.Release(ctx, r.MachineID.String); rerr != nil && !errors.Is(rerr, providers.ErrNoMachine) {
					j.Log.Warn("releasing the machine of a failed bootstrap", "bootstrapId", r.BootstrapID, "machineId", r.MachineID.String, "error", rerr.Error())
				}
			}
		}
	}
	return nil
}

func (j *Job) step(ctx context.Context, fence workers.Fence, r db.ProviderBootstrap) error {
	q := db.New(j.Store.Pool())
	acct, err := q.GetProviderAccount(ctx, r.AccountID)
	if errors.Is(err, pgx.ErrNoRows) {
		return j.fail(ctx, fence, r, "the provider account was deleted")
	}
	if err != nil {
		return err
	}
	p, err := j.Service.client(acct)
	if err != nil {
		return j.retry(ctx, fence, r, err)
	}
	now := time.Now()
	switch r.State {
	case StateIdentifying:
		m, err := p.Identify(ctx, r.MachineID.String)
		if errors.Is(err, providers.ErrNoMachine) {
			return j.fail(ctx, fence, r, fmt.Sprintf("machine %s is not a machine of account %s", r.MachineID.String, r.AccountID))
		}
		if err != nil {
			return j.retry(ctx, fence, r, err)
		}
		now = time.Now() // the machine is there now
		r.State, r.MachineAt, r.Attempts, r.Error, r.NextAttemptAt = StateInstalling, &now, 0, pgtype.Text{}, now
		j.Log.Info("provider bootstrap identified its machine", "bootstrapId", r.BootstrapID, "machineId", m.ID)
		if err := j.save(ctx, fence, r); err != nil {
			return err
		}
		return j.install(ctx, fence, r, p) // at once: nothing to wait for
	case StateClaiming:
		m, err := p.Claim(ctx, r.OfferID.String, r.BootstrapID)
		if err != nil {
			return j.retry(ctx, fence, r, err)
		}
		now = time.Now() // the machine is there now
		r.State, r.MachineID, r.Claimed, r.MachineAt, r.Attempts, r.Error, r.NextAttemptAt = StateInstalling, str(m.ID), true, &now, 0, pgtype.Text{}, now
		j.Log.Info("provider bootstrap claimed a machine", "bootstrapId", r.BootstrapID, "machineId", m.ID)
		if err := j.save(ctx, fence, r); err != nil {
			return err
		}
		return j.install(ctx, fence, r, p) // at once: nothing to wait for
	case StateInstalling:
		return j.install(ctx, fence, r, p)
	case StateJoining:
		n, err := q.JoinedNodeOfToken(ctx, r.TokenID.String)
		if err != nil {
			return err
		}
		if n.NodeID.Valid && n.NodeState.Valid && n.NodeState.String == nodes.StateReady {
			r.State, r.NodeID, r.FinishedAt, r.Error = StateJoined, n.NodeID, &now, pgtype.Text{}
			return j.save(ctx, fence, r, outbox.Event{Type: api.EventProviderBootstrapJoined, Subject: r.AccountID, TenantID: r.TenantID,
				Data: api.ProviderBootstrapJoinedPayload{AccountID: r.AccountID, PoolID: r.PoolID, MachineID: r.MachineID.String, NodeID: n.NodeID.String}})
		}
		if r.InstalledAt != nil && now.Sub(*r.InstalledAt) > JoinTimeout {
			return j.fail(ctx, fence, r, fmt.Sprintf("the daemon of machine %s did not join within %s", r.MachineID.String, JoinTimeout))
		}
		r.NextAttemptAt = now.Add(JobEvery / 2)
		return j.save(ctx, fence, r)
	}
	return nil
}

// install mints a join token bound to the machine (its row only is
// stored; an earlier attempt's unused token is revoked), hands the token
// to the provider, and forgets it.
func (j *Job) install(ctx context.Context, fence workers.Fence, r db.ProviderBootstrap, p providers.Provider) error {
	s := j.Service
	if s.bootstrap == nil {
		return j.retry(ctx, fence, r, errors.New("this service has no bootstrap options"))
	}
	b, err := s.bundle()
	if err != nil {
		return j.retry(ctx, fence, r, fmt.Errorf("no PKI bundle: %w", err))
	}
	var token string
	err = workers.Tx(ctx, j.Store, j.Notifier, fence, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		pool, err := q.GetPool(ctx, r.PoolID)
		if err != nil {
			return err
		}
		if r.TokenID.Valid {
			if err := q.RevokeJoinToken(ctx, r.TokenID.String); err != nil {
				return err
			}
		}
		tok, id, err := join.MintFor(ctx, tx, b, r.TenantID, r.PoolID, pool.SiteID, r.CreatedBy, r.MachineID.String, 0, time.Now())
		if err != nil {
			return err
		}
		r.TokenID, token = str(id), tok
		_, err = q.SaveProviderBootstrap(ctx, saveParams(r))
		return err
	})
	if err != nil {
		return err
	}
	joinURL := s.bootstrap.JoinURL
	if joinURL == "" {
		joinURL = s.baseURL
	}
	in := providers.Install{JoinURL: joinURL, Token: token, Agent: s.bootstrap.Agent, PoolID: r.PoolID, CloudAttested: s.cloudAttested}
	if s.downloads != "" {
		// Downloaded and verified by the provider, not copied from here.
		in.Agent, in.AgentURL = "", s.downloads
		if k := b.ReleaseKey(); k != nil {
			in.ReleaseKeys = []ed25519.PublicKey{k}
		}
	}
	m, err := p.Identify(ctx, r.MachineID.String)
	if err == nil {
		err = p.Install(ctx, m, in)
	}
	in.Token = ""
	token = "" //nolint:ineffassign // the token is not kept past the call
	_ = token
	if errors.Is(err, providers.ErrNoMachine) {
		return j.fail(ctx, fence, r, fmt.Sprintf("machine %s is gone", r.MachineID.String))
	}
	if err != nil {
		return j.retry(ctx, fence, r, err)
	}
	now := time.Now()
	r.State, r.InstalledAt, r.Attempts, r.Error, r.NextAttemptAt = StateJoining, &now, 0, pgtype.Text{}, now
	return j.save(ctx, fence, r, outbox.Event{Type: api.EventProviderBootstrapInstalled, Subject: r.AccountID, TenantID: r.TenantID,
		Data: api.ProviderBootstrapInstalledPayload{AccountID: r.AccountID, PoolID: r.PoolID, MachineID: r.MachineID.String}})
}

// Job returns the bootstrap reconciler of the service.
func (s *Service) Job(st *store.Store, n *notify.Notifier, log *slog.Logger) *Job {
	if log == nil {
		log = s.log
	}
	return &Job{Service: s, Store: st, Notifier: n, Log: log}
}
