package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/notify"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/system"
	"computeplane/internal/workers"
)

// SweeperJob is the singleton job of the command sweeper.
const SweeperJob = "command-sweeper"

// Sweeper timing: unacknowledged commands are re-sent every SweepEvery;
// gateway rows gone for an hour are deleted.
const (
	SweepEvery     = 5 * time.Second
	DeadGatewayTTL = time.Hour
)

// Sweeper is the command sweeper: it re-sends commands whose result did
// not come within SweepEvery, expires overdue ones, and marks nodes down
// whose daemon has been out of session for DownAfter (node.down).
type Sweeper struct {
	Store     *store.Store
	Notifier  *notify.Notifier
	DownAfter time.Duration
	Log       *slog.Logger
}

// Periodic is the sweeper's job: a pass every SweepEvery, bounded by
// it, every write fenced by the lease.
func (s *Sweeper) Periodic() *workers.Periodic {
	return &workers.Periodic{Name: SweeperJob, Interval: SweepEvery, PassTimeout: SweepEvery, Pass: s.Pass, Log: s.Log}
}

// Pass runs one sweep; the gateways of re-sent commands are woken after
// the commit.
func (s *Sweeper) Pass(ctx context.Context, fence workers.Fence) error {
	return workers.Tx(ctx, s.Store, s.Notifier, fence, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		resent, err := q.ResendCommands(ctx, SweepEvery.Milliseconds())
		if err != nil {
			return err
		}
		for _, r := range resent {
			notify.Later(ctx, topicOf(r.SessionGateway))
		}
		if _, err := q.ExpireCommands(ctx); err != nil {
			return err
		}
		lost, err := q.LostSessions(ctx, s.DownAfter.Milliseconds())
		if err != nil {
			return err
		}
		for _, n := range lost {
			if err := q.MarkNodeDown(ctx, n.NodeID); err != nil {
				return err
			}
			if err := outbox.Write(ctx, tx, outbox.Event{Type: api.EventNodeDown, Subject: n.NodeID, TenantID: n.Owner,
				Data: api.NodeDownPayload{NodeID: n.NodeID}}); err != nil {
				return err
			}
		}
		_, err = q.DeleteDeadGateways(ctx, DeadGatewayTTL.Milliseconds())
		return err
	})
}

// Check is the gateways' part of system.selfCheck: sweeper lag, gateway
// headroom, stale heartbeats, daemon protocol skew and node certificates
// expiring within seven days.
func Check() system.Check {
	return system.Check{Name: "gateways", Run: func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error) {
		f, err := db.New(tx).GatewayFindings(ctx, agentproto.ProtocolMin)
		if err != nil {
			return nil, err
		}
		var out []api.Finding
		add := func(sev, format string, args ...any) {
			out = append(out, api.Finding{Check: "gateways", Severity: sev, Message: fmt.Sprintf(format, args...)})
		}
		if f.UnresentCommands > 0 || f.UnexpiredCommands > 0 {
			add(system.SeverityWarning, "command sweeper lag: %d commands unacknowledged past three sweeps, %d overdue not expired",
				f.UnresentCommands, f.UnexpiredCommands)
		}
		switch {
		case f.MaxStreams == 0:
			add(system.SeverityInfo, "no live gateway")
		case f.Sessions*10 >= f.MaxStreams*9:
			add(system.SeverityWarning, "gateway headroom: %d of %d sessions in use", f.Sessions, f.MaxStreams)
		default:
			add(system.SeverityInfo, "gateway headroom: %d of %d sessions in use", f.Sessions, f.MaxStreams)
		}
		if f.StaleHeartbeats > 0 {
			add(system.SeverityWarning, "%d daemon sessions have not been heard from for 30 s (stale heartbeats)", f.StaleHeartbeats)
		}
		if f.ProtocolSkew > 0 {
			add(system.SeverityWarning, "%d daemons speak a protocol below %d (daemon protocol skew)", f.ProtocolSkew, agentproto.ProtocolMin)
		}
		if f.ExpiringCerts > 0 {
			add(system.SeverityWarning, "%d node certificates expire within 7 days", f.ExpiringCerts)
		}
		var trust int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM trust_versions`).Scan(&trust); err != nil {
			return nil, err
		}
		if trust > 0 {
			add(system.SeverityInfo, "trust bundle version %d", trust)
		}
		accel, err := db.New(tx).AccelCensus(ctx)
		if err != nil {
			return nil, err
		}
		for _, a := range accel {
			switch {
			case a.Runtime == "qemu" && a.Accel == "tcg":
				add(system.SeverityInfo, "%d qemu hosts run VMs under TCG (software emulation: no working KVM there)", a.Nodes)
			case a.Runtime == "qemu":
				add(system.SeverityInfo, "%d qemu hosts run VMs under %s", a.Nodes, a.Accel)
			}
		}
		return out, nil
	}}
}
