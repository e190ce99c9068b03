package nodes

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/system"
)

// Check is the fleet's part of system.selfCheck: daemon-run nodes counted
// ready without a session (a stale heartbeat) are a warning; a node booked
// past its capacity or a quota used past its max is an error (the
// database's constraints forbid both, so one means they were dropped).
func Check() system.Check {
	return system.Check{Name: "fleet", Run: func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error) {
		c, err := db.New(tx).FleetCensus(ctx)
		if err != nil {
			return nil, err
		}
		out := []api.Finding{{Check: "fleet", Severity: system.SeverityInfo, Message: "nodes and quotas within their bounds"}}
		if c.Sessionless > 0 {
			out = append(out, api.Finding{Check: "fleet", Severity: system.SeverityWarning,
				Message: fmt.Sprintf("%d daemon-run nodes are ready without a session (stale heartbeats)", c.Sessionless)})
		}
		if c.Overbooked > 0 || c.Overdrawn > 0 {
			out[0] = api.Finding{Check: "fleet", Severity: system.SeverityError,
				Message: fmt.Sprintf("%d nodes booked past capacity, %d quotas used past max", c.Overbooked, c.Overdrawn)}
		}
		return out, nil
	}}
}
