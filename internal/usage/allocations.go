// Package usage meters billable work and hands it to billing.
//
// Every billable change opens an allocation in its own transaction
// (Open) and the change that ends it closes it (Close): a meter, a
// quantity per hour, a tenant and project, a start and an end. The rollup
// (Rollup, run by the workers every capacity.rollupEvery) turns
// allocations into hourly windows; the hand-over (Handover, every
// capacity.usageEvery) gives closed windows to billing through the
// identity port's billing bridge, key cmp:<allocationId>:<windowStartMs>,
// and records the outcome. A window is never changed after it is written:
// a later correction is an adjustment window of its own. A counted meter
// (vps.egress.bytes) has no allocation: MeterEgress adds what the
// daemons counted to a row per instance and hour, windowed the same way
// (counted.go).
//
// Units: a quantity per hour is an integer of micro-units (1e-6 of the
// meter's unit); a window's quantity is an integer of micro-unit-
// milliseconds (quantity per hour times the milliseconds it covers), so
// prorating a partial hour and summing windows are exact. Quantity (the
// API's number) is that integer divided by 3.6e9.
package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/ids"
	"computeplane/internal/store"
)

// Micro is one unit in micro-units: 2 vCPU are 2 * Micro per hour.
const Micro = 1_000_000

// microMsPerUnitHour converts a window's micro-unit-milliseconds to units.
const microMsPerUnitHour = Micro * 3_600_000

// Quantity is a window's integer quantity in the meter's unit.
func Quantity(microMs int64) float64 { return float64(microMs) / microMsPerUnitHour }

// TagProject is the window tag that carries the project.
const TagProject = "project"

// Allocation opens metering of one meter.
type Allocation struct {
	TenantID  string
	ProjectID string // "" for none
	Meter     string // a meter of catalog/meters.yaml
	// PerHour is the quantity per hour in micro-units.
	PerHour int64
	Owner   Owner
	Tags    map[string]string
	// At is when it starts; zero is the transaction's time.
	At time.Time
}

// Owner is the billable object an allocation measures.
type Owner struct{ Type, ID string }

var meters = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range api.Meters {
		m[s.Name] = true
	}
	return m
}()

// Open starts an allocation in tx, the transaction of the change that makes
// the work billable, and returns its id (alloc_...).
func Open(ctx context.Context, tx pgx.Tx, a Allocation) (string, error) {
	opened, err := OpenAll(ctx, tx, a)
	if err != nil {
		return "", err
	}
	return opened[0], nil
}

// OpenAll starts allocations that begin at the same time (one owner's
// meters) in tx, in one statement, and returns their ids in the order of
// as.
func OpenAll(ctx context.Context, tx pgx.Tx, as ...Allocation) ([]string, error) {
	if len(as) == 0 {
		return nil, nil
	}
	n := len(as)
	p := db.OpenAllocationsParams{AllocationIds: make([]string, n), TenantIds: make([]string, n), ProjectIds: make([]string, n),
		Meters: make([]string, n), QuantitiesMicro: make([]int64, n), Tags: make([]string, n), OwnerTypes: make([]string, n), OwnerIds: make([]string, n)}
	for i, a := range as {
		switch {
		case !meters[a.Meter]:
			return nil, fmt.Errorf("usage: %q is not a meter of catalog/meters.yaml", a.Meter)
		case a.TenantID == "" || a.Owner.Type == "" || a.Owner.ID == "":
			return nil, errors.New("usage: an allocation needs a tenant and an owner")
		case a.PerHour < 0:
			return nil, errors.New("usage: a quantity per hour is at least 0")
		case !a.At.Equal(as[0].At):
			return nil, errors.New("usage: allocations opened together start at the same time")
		}
		tags := map[string]string{}
		for k, v := range a.Tags {
			tags[k] = v
		}
		if a.ProjectID != "" {
			tags[TagProject] = a.ProjectID
		}
		raw, err := json.Marshal(tags)
		if err != nil {
			return nil, err
		}
		p.AllocationIds[i], p.TenantIds[i], p.ProjectIds[i] = ids.New("alloc"), a.TenantID, a.ProjectID
		p.Meters[i], p.QuantitiesMicro[i], p.Tags[i] = a.Meter, a.PerHour, string(raw)
		p.OwnerTypes[i], p.OwnerIds[i] = a.Owner.Type, a.Owner.ID
	}
	if !as[0].At.IsZero() {
		at := as[0].At
		p.At = &at
	}
	// Nothing is read back: the rows go out with the call's next statement.
	if err := db.New(store.Later(tx)).OpenAllocations(ctx, p); err != nil {
		return nil, err
	}
	return p.AllocationIds, nil
}

// Close ends an open allocation at at (zero: the transaction's time), in
// the transaction of the change that ends the billable work. Closing one
// that is closed or unknown is an error: a module that closes what it did
// not open has lost track of its billing.
func Close(ctx context.Context, tx pgx.Tx, allocationID string, at time.Time) error {
	var when *time.Time
	if !at.IsZero() {
		when = &at
	}
	_, err := db.New(tx).CloseAllocation(ctx, db.CloseAllocationParams{AllocationID: allocationID, At: when})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("usage: allocation %s is not open", allocationID)
	}
	return err
}

// CloseOwner ends every open allocation of an owner (an instance deleted,
// a volume released), in tx, in one statement. Nothing is read back, so
// it is held (store.Later) to travel with tx's next statement or its
// COMMIT.
func CloseOwner(ctx context.Context, tx pgx.Tx, o Owner, at time.Time) error {
	var when *time.Time
	if !at.IsZero() {
		when = &at
	}
	return db.New(store.Later(tx)).CloseAllocationsOf(ctx, db.CloseAllocationsOfParams{OwnerType: o.Type, OwnerID: o.ID, At: when})
}
