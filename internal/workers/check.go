package workers

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/system"
)

// Check is the self check of the workers: how many are live, and a warning
// naming each worker whose heartbeat is stale (a process that died without
// leaving; its leases have lapsed and others took its work).
func Check() system.Check {
	return system.Check{Name: "workers", Run: func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error) {
		rows, err := db.New(tx).ListWorkers(ctx, nil)
		if err != nil {
			return nil, err
		}
		var stale []string
		live := 0
		for _, r := range rows {
			if r.Live {
				live++
			} else {
				stale = append(stale, fmt.Sprintf("%s (%s pid %d, last heartbeat %s)", r.ID, r.Host, r.Pid, r.HeartbeatAt.UTC().Format("2006-01-02T15:04:05Z")))
			}
		}
		out := []api.Finding{{Check: "workers", Severity: system.SeverityInfo, Message: fmt.Sprintf("%d live workers", live)}}
		if len(stale) > 0 {
			out = append(out, api.Finding{Check: "workers", Severity: system.SeverityWarning,
				Message: "stale heartbeats: " + strings.Join(stale, ", ")})
		}
		return out, nil
	}}
}
