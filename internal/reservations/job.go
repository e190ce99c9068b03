package reservations

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/notify"
	"computeplane/internal/placement"
	"computeplane/internal/store"
	"computeplane/internal/workers"
)

// JobName is the singleton job that moves reservations in time.
const JobName = "reservations"

// JobEvery is how often the job looks when nothing woke it.
const JobEvery = 500 * time.Millisecond

// Job moves reservations that have something due: preempting ones whose
// notice ran out lose their capacity; queued ones are placed (their
// placement items decided, or the capacity taken back from spot ones
// free); placed ones become active at their start; placed and active
// ones end at their end.
type Job struct {
	Service     *Service
	Store       *store.Store
	Notifier    *notify.Notifier
	MaxAttempts int
	Log         *slog.Logger
}

// Periodic is the job: a pass every JobEvery, or at once when woken
// (TopicJob), each bounded to 10 s.
func (j *Job) Periodic() *workers.Periodic {
	return &workers.Periodic{Name: JobName, Interval: JobEvery, Wake: TopicJob, PassTimeout: 10 * time.Second,
		Pass: j.Pass, Notifier: j.Notifier, Log: j.Log}
}

// Pass runs once, in one transaction fenced by the lease. Node specs
// changed here (instances of an ending reservation) wake their gateways
// after the commit.
func (j *Job) Pass(ctx context.Context, fence workers.Fence) error {
	return workers.Tx(ctx, j.Store, j.Notifier, fence, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		rows, err := q.DueReservations(ctx)
		if err != nil {
			return err
		}
		var now time.Time
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return err
		}
		// Preempted capacity first: the queued ones below may need it.
		for _, r := range rows {
			if r.State == StatePreempting {
				if r, err = j.Service.finish(ctx, tx, r, StatePreempted, "preempted by an on-demand reservation"); err != nil {
					return err
				}
				if err := write(ctx, tx, api.EventReservationPreempted, r, api.ReservationPreemptedPayload{ReservationID: r.ReservationID}); err != nil {
					return err
				}
			}
		}
		for _, r := range rows {
			if _, err := j.step(ctx, tx, r, now); err != nil {
				return err
			}
		}
		return nil
	})
}

// step moves one due reservation; it reports whether it wrote events.
func (j *Job) step(ctx context.Context, tx pgx.Tx, r db.Reservation, now time.Time) (bool, error) {
	q := db.New(tx)
	switch {
	case r.State == StateQueued && r.WaitingForPreemption:
		return j.placeWaiting(ctx, tx, r, now)
	case r.State == StateQueued:
		return j.placeQueued(ctx, tx, r, now)
	case (r.State == StatePlaced || r.State == StateActive) && r.EndAt != nil && !r.EndAt.After(now):
		r, err := j.Service.finish(ctx, tx, r, StateEnded, "")
		if err != nil {
			return false, err
		}
		return true, write(ctx, tx, api.EventReservationEnded, r, api.ReservationEndedPayload{ReservationID: r.ReservationID})
	case r.State == StatePlaced && !r.StartAt.After(now):
		r, err := q.SetReservationState(ctx, db.SetReservationStateParams{ReservationID: r.ReservationID, State: StateActive})
		if err != nil {
			return false, err
		}
		return true, write(ctx, tx, api.EventReservationActive, r, api.ReservationActivePayload{ReservationID: r.ReservationID})
	}
	return false, nil
}

// placeWaiting tries again to book a reservation waiting for preempted
// spot capacity; it fails after MaxAttempts tries once no spot
// reservation of its pool is still preempting.
func (j *Job) placeWaiting(ctx context.Context, tx pgx.Tx, r db.Reservation, now time.Time) (bool, error) {
	q := db.New(tx)
	f, err := flavorOf(ctx, q, r)
	if err != nil {
		return false, err
	}
	_, err = j.Service.admitAll(ctx, tx, unit(r, f), int(r.Count), nil)
	if err == nil {
		return true, j.placed(ctx, tx, r, f, now)
	}
	if !isCode(err, api.CodeCapacityUnavailable) && !isCode(err, api.CodeQuotaExceeded) {
		return false, err
	}
	var preempting bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reservations WHERE pool_id = $1 AND state = 'preempting')`, r.PoolID).Scan(&preempting); err != nil {
		return false, err
	}
	attempt := int32(0)
	if !preempting {
		attempt = 1
	}
	if !preempting && int(r.Attempts)+1 >= max(j.MaxAttempts, 1) {
		r, err := j.Service.finish(ctx, tx, r, StateFailed, "no capacity came free: "+err.Error())
		if err != nil {
			return false, err
		}
		return true, write(ctx, tx, api.EventReservationFailed, r, api.ReservationFailedPayload{ReservationID: r.ReservationID, Error: r.Error.String})
	}
	_, err = q.SetReservationState(ctx, db.SetReservationStateParams{ReservationID: r.ReservationID, State: StateQueued,
		WaitingForPreemption: true, Attempt: attempt})
	return false, err
}

// placeQueued follows the placement items the pool's worker decides.
func (j *Job) placeQueued(ctx context.Context, tx pgx.Tx, r db.Reservation, now time.Time) (bool, error) {
	q := db.New(tx)
	placed := 0
	for _, id := range r.PlacementItems {
		it, err := placement.GetItem(ctx, q, id)
		if err != nil {
			return false, err
		}
		switch it.State {
		case placement.ItemFailed:
			msg := "placement failed"
			if it.Error != nil {
				msg = it.Error.Message
			}
			r, err := j.Service.finish(ctx, tx, r, StateFailed, msg)
			if err != nil {
				return false, err
			}
			return true, write(ctx, tx, api.EventReservationFailed, r, api.ReservationFailedPayload{ReservationID: r.ReservationID, Error: msg})
		case placement.ItemPlaced:
			placed++
		}
	}
	if placed < len(r.PlacementItems) {
		return false, nil
	}
	f, err := flavorOf(ctx, q, r)
	if err != nil {
		return false, err
	}
	return true, j.placed(ctx, tx, r, f, now)
}

func (j *Job) placed(ctx context.Context, tx pgx.Tx, r db.Reservation, f *api.Flavor, now time.Time) error {
	state := StatePlaced
	if !r.StartAt.After(now) {
		state = StateActive
	}
	r, err := db.New(tx).SetReservationState(ctx, db.SetReservationStateParams{ReservationID: r.ReservationID, State: state})
	if err != nil {
		return err
	}
	return placedEvents(ctx, tx, r, f, nil)
}
