package admission

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
)

func TestInFlightLimitRefusesTheCallBeyondIt(t *testing.T) {
	c := New(Limits{MaxInFlight: 2})
	require.NoError(t, c.Enter())
	require.NoError(t, c.Enter())
	requireLimited(t, c.Enter(), InFlightRetryAfter.Milliseconds())
	assert.Equal(t, 2, c.InFlight(), "a refused call holds no slot")
	c.Leave()
	assert.Equal(t, 1, c.InFlight())
	require.NoError(t, c.Enter())
	require.Error(t, c.Enter())
	c.Leave()
	c.Leave()
	assert.Zero(t, c.InFlight())
}

// TestInFlightLimitHoldsUnderRacingCallers: however callers race, no more
// than the limit are ever inside, and every slot comes back.
func TestInFlightLimitHoldsUnderRacingCallers(t *testing.T) {
	const limit = 4
	c := New(Limits{MaxInFlight: limit})
	var inside, most, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 500 {
				if err := c.Enter(); err != nil {
					refused.Add(1)
					continue
				}
				n := inside.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				admitted.Add(1)
				inside.Add(-1)
				c.Leave()
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int64(limit))
	assert.Equal(t, int64(32*500), admitted.Load()+refused.Load())
	assert.Positive(t, admitted.Load())
	assert.Zero(t, c.InFlight())
}

func TestTenantBucketRefusesPastItsBurstAndRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{TenantRate: 2, TenantBurst: 3})
	c.now = func() time.Time { return now }
	for range 3 {
		require.NoError(t, c.Tenant("acme"))
	}
	err := c.Tenant("acme")
	requireLimited(t, err, 500) // a token every 500 ms
	require.NoError(t, c.Tenant("globex"), "another tenant has its own bucket")
	now = now.Add(500 * time.Millisecond)
	require.NoError(t, c.Tenant("acme"))
	require.Error(t, c.Tenant("acme"))
	require.NoError(t, c.Tenant(""), "a method without a tenant is not limited")
}

func TestIdleTenantsBucketsAreDroppedWhenTheMapIsFull(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{TenantRate: 1000, TenantBurst: 1})
	c.now = func() time.Time { return now }
	for i := range maxTenants {
		require.NoError(t, c.Tenant(string(rune('a'+i%26))+time.Duration(i).String()))
	}
	now = now.Add(time.Second) // every bucket is full again
	require.NoError(t, c.Tenant("newcomer"))
	assert.Len(t, c.buckets, 1)
}

func TestNoLimitsAdmitEverything(t *testing.T) {
	for _, c := range []*Controller{nil, New(Limits{})} {
		for range 100 {
			require.NoError(t, c.Enter())
			require.NoError(t, c.Tenant("acme"))
		}
		assert.Zero(t, c.InFlight())
	}
}

func requireLimited(t *testing.T, err error, retryAfterMs int64) {
	t.Helper()
	var se *api.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, api.CodeRateLimited, se.Code)
	assert.Equal(t, retryAfterMs, se.Details["retryAfterMs"])
}
