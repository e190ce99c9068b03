package workers_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
	"computeplane/internal/workers"
)

func TestCheckReportsStaleHeartbeats(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	ctx := t.Context()
	_, err := st.Pool().Exec(ctx, `INSERT INTO workers (id, host, pid, heartbeat_at) VALUES
		('alive', 'h1', 1, now()), ('gone', 'h2', 2, now() - interval '5 minutes')`)
	require.NoError(t, err)
	var msgs []string
	var sev []string
	require.NoError(t, st.WithTx(ctx, true, func(ctx context.Context, tx pgx.Tx) error {
		findings, err := workers.Check().Run(ctx, tx)
		for _, f := range findings {
			msgs, sev = append(msgs, f.Message), append(sev, f.Severity)
		}
		return err
	}))
	require.Len(t, msgs, 2)
	assert.Equal(t, "1 live workers", msgs[0])
	assert.Equal(t, "warning", sev[1])
	assert.Contains(t, msgs[1], "gone (h2 pid 2")
	assert.NotContains(t, msgs[1], "alive")
}
