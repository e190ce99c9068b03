package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

// A daemon that dials a (re)starting gateway while it still reads the
// database (its lease, the revocations, the trust version) waits in the
// listener's accept queue and gets its session once the start is done,
// instead of being refused and sent into its backoff (agent.Run: 200 ms
// doubling), which after a restart puts every refused daemon behind the
// gateway by up to its next delay. Nothing is accepted before the
// revocations are loaded. The start is held here by a lock on the leases
// table, which the lease's write waits for.
func TestADialDuringTheGatewaysStartWaitsForItInsteadOfBeingRefused(t *testing.T) {
	w := setupUnstarted(t)
	n := w.newNode(t)

	ctx := t.Context()
	lockConn, err := w.env.Store.Pool().Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(lockConn.Release)
	lock, err := lockConn.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `lock table leases in exclusive mode`)
	require.NoError(t, err)
	locked := true
	t.Cleanup(func() {
		if locked {
			_ = lock.Rollback(context.Background())
		}
	})

	started := make(chan error, 1)
	go func() { started <- w.gw.Start(ctx) }()
	t.Cleanup(w.gw.Drain)
	require.Eventually(t, func() bool {
		var waiting int
		return lockConn.QueryRow(ctx, `select count(*) from pg_locks where not granted and relation = 'leases'::regclass`).Scan(&waiting) == nil && waiting > 0
	}, 10*time.Second, 5*time.Millisecond, "the gateway's start waits for its lease")

	type dialled struct {
		err error
		at  time.Time
	}
	dial := make(chan dialled, 1)
	go func() {
		conn, err := w.dial(ctx, n.cert, n.key)
		if err == nil {
			t.Cleanup(func() { _ = conn.CloseNow() })
			send(t, conn, hello(n.nodeID, 0))
			var m agentproto.Message
			if m, err = recv(ctx, conn); err == nil && m.Type != agentproto.TypeWelcome {
				err = context.Canceled
			}
		}
		dial <- dialled{err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond) // the dial is in, the start still held
	select {
	case err := <-started:
		t.Fatalf("the start did not wait for its lease: %v", err)
	default:
	}
	released := time.Now()
	require.NoError(t, lock.Rollback(ctx))
	locked = false
	require.NoError(t, <-started)
	d := <-dial
	require.NoError(t, d.err, "the dial made during the start has its session")
	require.True(t, d.at.After(released), "no session before the start is done")
}
