package provideraccounts

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/instances"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/providers"
	"computeplane/internal/store"
	"computeplane/internal/workers"
)

// InstancesJobName is the singleton job that launches, watches and
// releases the machines of provider pools' instances.
const InstancesJobName = "provider-instances"

// WatchEvery is how often a running provider instance's machine is looked
// at (identify): one that is gone makes the instance failed.
var WatchEvery = 10 * time.Second

// CheckLaunch answers instances.create in a provider pool
// (instances.Launchers): the pool's account must exist and its provider
// be registered and able to launch instances.
func (s *Service) CheckLaunch(ctx context.Context, q *db.Queries, accountID string) error {
	acct, err := q.GetProviderAccount(ctx, accountID)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Errorf(api.CodeNotFound, "poolId: the pool's provider account %s no longer exists", accountID)
	}
	if err != nil {
		return err
	}
	f, ok := s.reg.Get(acct.Provider)
	if !ok {
		return api.Errorf(api.CodeInvalidConfig, "provider %s of account %s is no longer registered on this service", acct.Provider, accountID)
	}
	if !f.Manifest.Can(providers.CapInstances) {
		return api.Errorf(api.CodeUnsupported, "poolId: provider %s of the pool's account does not launch instances", acct.Provider).
			WithDetails(map[string]any{"provider": acct.Provider})
	}
	return nil
}

// InstancesJob is the provider-instances reconciler: for each provider
// instance due, it launches its machine (on the smallest offer that holds
// its flavor), watches it, or releases it once the instance is deleted.
// Provider calls are made outside any transaction; what they found is
// written under the job's lease.
type InstancesJob struct {
	Service *Service
	Store   *store.Store
	// Notifier, when set, wakes a pass as soon as an instance is created
	// (instances.TopicProviderInstances) rather than at the next tick, and
	// wakes the outbox's readers after a pass wrote events.
	Notifier *notify.Notifier
	Log      *slog.Logger
}

// InstancesJob returns the provider-instances job of the service.
func (s *Service) InstancesJob(st *store.Store, n *notify.Notifier, log *slog.Logger) *InstancesJob {
	return &InstancesJob{Service: s, Store: st, Notifier: n, Log: log}
}

// Periodic is the job: a pass every JobEvery, or at once when an instance
// is created (instances.TopicProviderInstances). A pass has no overall
// bound: its provider calls bound themselves.
func (j *InstancesJob) Periodic() *workers.Periodic {
	return &workers.Periodic{Name: InstancesJobName, Interval: JobEvery, Wake: instances.TopicProviderInstances,
		Pass: j.Pass, Notifier: j.Notifier, Log: j.Log}
}

// Pass moves every due provider instance one step.
func (j *InstancesJob) Pass(ctx context.Context, fence workers.Fence) error {
	rows, err := db.New(j.Store.Pool()).DueProviderInstances(ctx, 16)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range rows {
		if err := j.step(ctx, fence, r); err != nil {
			errs = append(errs, fmt.Errorf("instance %s: %w", r.InstanceID, err))
		}
	}
	return errors.Join(errs...)
}

func (j *InstancesJob) step(ctx context.Context, fence workers.Fence, r db.Instance) error {
	q := db.New(j.Store.Pool())
	pool, err := q.GetPool(ctx, r.PoolID)
	if err != nil {
		return err
	}
	acct, err := q.GetProviderAccount(ctx, pool.AccountID.String)
	if errors.Is(err, pgx.ErrNoRows) {
		// (Accounts with undeleted instances cannot be deleted.)
		return j.finish(ctx, fence, r, "the provider account was deleted")
	}
	if err != nil {
		return err
	}
	p, err := j.Service.client(acct)
	if err != nil {
		return j.retry(ctx, fence, r, err)
	}
	switch {
	case r.DesiredState == instances.StateDeleted:
		if r.ProviderMachine.Valid {
			if err := p.Release(ctx, r.ProviderMachine.String); err != nil && !errors.Is(err, providers.ErrNoMachine) {
				return j.retry(ctx, fence, r, err)
			}
			j.Log.Info("provider instance released its machine", "instanceId", r.InstanceID, "machineId", r.ProviderMachine.String)
		}
		r.State, r.ProviderNextAt, r.Error = instances.StateDeleted, nil, pgtype.Text{}
		return j.save(ctx, fence, r)
	case !r.ProviderMachine.Valid:
		return j.launch(ctx, fence, r, acct, p)
	case r.State == instances.StateRunning:
		m, err := p.Identify(ctx, r.ProviderMachine.String)
		switch {
		case errors.Is(err, providers.ErrNoMachine):
			return j.failed(ctx, fence, r, fmt.Sprintf("the provider's machine %s is gone", r.ProviderMachine.String))
		case err != nil:
			j.Log.Info("provider instance: identify failed; looking again later", "instanceId", r.InstanceID, "error", err.Error())
		case m.State != "running":
			return j.failed(ctx, fence, r, fmt.Sprintf("the provider's machine %s is %s", m.ID, m.State))
		}
		next := time.Now().Add(WatchEvery)
		r.ProviderNextAt = &next
		return j.save(ctx, fence, r)
	}
	r.ProviderNextAt = nil // failed: nothing to do until it is deleted
	return j.save(ctx, fence, r)
}

// launch picks the smallest offer that holds the instance's flavor and
// has the provider launch a machine of it, keyed by the instance (a
// launch retried after a crash finds the machine it made).
func (j *InstancesJob) launch(ctx context.Context, fence workers.Fence, r db.Instance, acct db.ProviderAccount, p providers.Provider) error {
	launcher, ok := p.(providers.Launcher)
	if !ok {
		return j.failed(ctx, fence, r, fmt.Sprintf("provider %s does not launch instances", acct.Provider))
	}
	offers, err := p.Offers(ctx, providers.Query{Kind: "vps", MinVCPU: int64(r.Vcpu)})
	if err != nil {
		return j.retry(ctx, fence, r, err)
	}
	offers = slices.DeleteFunc(offers, func(o providers.Offer) bool {
		return o.Kind != "vps" || o.VCPU < int64(r.Vcpu) || o.MemoryMiB < r.MemoryMib
	})
	if len(offers) == 0 {
		return j.failed(ctx, fence, r, fmt.Sprintf("no offer of account %s holds %d vCPU and %d MiB", acct.AccountID, r.Vcpu, r.MemoryMib))
	}
	best := slices.MinFunc(offers, func(a, b providers.Offer) int {
		return cmp.Or(cmp.Compare(a.VCPU, b.VCPU), cmp.Compare(a.MemoryMiB, b.MemoryMiB), cmp.Compare(a.ID, b.ID))
	})
	userData, err := j.userData(ctx, r)
	if err != nil {
		return j.retry(ctx, fence, r, err)
	}
	m, err := launcher.Launch(ctx, best.ID, r.InstanceID, providers.Launch{ImageID: r.ImageID, Hostname: r.Name, UserData: userData})
	if err != nil {
		return j.retry(ctx, fence, r, err)
	}
	j.Log.Info("provider instance launched", "instanceId", r.InstanceID, "offerId", best.ID, "machineId", m.ID)
	return j.write(ctx, fence, func(q *db.Queries) ([]outbox.Event, error) {
		r, err := q.RecordProviderLaunch(ctx, db.RecordProviderLaunchParams{InstanceID: r.InstanceID, ProviderMachine: str(m.ID),
			ProviderOffer: str(best.ID), WatchEvery: pgtype.Interval{Microseconds: WatchEvery.Microseconds(), Valid: true}})
		if err != nil || r.State != instances.StateRunning {
			return nil, err // deleted meanwhile: released at the next pass
		}
		return []outbox.Event{{Type: api.EventInstanceRunning, Subject: r.InstanceID, TenantID: r.TenantID,
			Data: api.InstanceRunningPayload{InstanceID: r.InstanceID, MachineID: &m.ID}}}, nil
	})
}

// userData resolves the secret references of the instance's user data for
// the provider's call (the provider is the host of a provider instance);
// the result is never stored.
func (j *InstancesJob) userData(ctx context.Context, r db.Instance) (string, error) {
	ud := r.UserData.String
	for _, ref := range agentproto.SecretReferences(ud) {
		v, err := j.Service.resolve(ctx, r.TenantID, ref)
		if err != nil {
			return "", fmt.Errorf("user data: %w", err)
		}
		ud = strings.ReplaceAll(ud, ref, v)
	}
	return ud, nil
}

// retry records a failed provider call: again after a backoff, or failed
// after MaxAttempts.
func (j *InstancesJob) retry(ctx context.Context, fence workers.Fence, r db.Instance, cause error) error {
	r.ProviderAttempts++
	if int(r.ProviderAttempts) >= MaxAttempts {
		if r.DesiredState == instances.StateDeleted {
			// Deleted all the same: the machine may be left at the provider.
			j.Log.Warn("provider instance: the machine could not be released", "instanceId", r.InstanceID,
				"machineId", r.ProviderMachine.String, "error", cause.Error())
			return j.finish(ctx, fence, r, "")
		}
		return j.failed(ctx, fence, r, fmt.Sprintf("%s (after %d attempts)", cause.Error(), r.ProviderAttempts))
	}
	next := time.Now().Add(backoff(r.ProviderAttempts))
	r.Error, r.ProviderNextAt = str(cause.Error()), &next
	j.Log.Info("provider instance: a provider call failed", "instanceId", r.InstanceID, "attempt", r.ProviderAttempts, "error", cause.Error())
	return j.save(ctx, fence, r)
}

// failed makes the instance failed (instance.failed); a machine it has is
// released when the instance is deleted.
func (j *InstancesJob) failed(ctx context.Context, fence workers.Fence, r db.Instance, why string) error {
	j.Log.Warn("provider instance failed", "instanceId", r.InstanceID, "error", why)
	r.State, r.Error, r.ProviderNextAt = instances.StateFailed, str(why), nil
	return j.save(ctx, fence, r, outbox.Event{Type: api.EventInstanceFailed, Subject: r.InstanceID, TenantID: r.TenantID,
		Data: api.InstanceFailedPayload{InstanceID: r.InstanceID, Error: why}})
}

// finish ends a deleted instance whose machine cannot be released, or
// fails a live one whose account is gone.
func (j *InstancesJob) finish(ctx context.Context, fence workers.Fence, r db.Instance, why string) error {
	if r.DesiredState != instances.StateDeleted {
		return j.failed(ctx, fence, r, why)
	}
	r.State, r.ProviderNextAt = instances.StateDeleted, nil
	return j.save(ctx, fence, r)
}

// save writes r as the job found it, if the row did not change meanwhile
// (a delete): the next pass reads it again.
func (j *InstancesJob) save(ctx context.Context, fence workers.Fence, r db.Instance, events ...outbox.Event) error {
	return j.write(ctx, fence, func(q *db.Queries) ([]outbox.Event, error) {
		_, err := q.SaveProviderInstance(ctx, db.SaveProviderInstanceParams{InstanceID: r.InstanceID, Version: r.Version, State: r.State,
			Error: r.Error, ProviderMachine: r.ProviderMachine, ProviderOffer: r.ProviderOffer, ProviderAttempts: r.ProviderAttempts,
			ProviderNextAt: r.ProviderNextAt})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil // changed meanwhile: read again next pass
		}
		return events, err
	})
}

// write runs change under the lease and writes the events it returns.
func (j *InstancesJob) write(ctx context.Context, fence workers.Fence, change func(q *db.Queries) ([]outbox.Event, error)) error {
	return writeFenced(ctx, j.Store, j.Notifier, fence, change)
}
