package admission

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/store"
)

func enter(t *testing.T, c *Controller) Ticket {
	t.Helper()
	tk, err := c.Enter()
	require.NoError(t, err)
	return tk
}

func TestInFlightLimitRefusesTheCallBeyondIt(t *testing.T) {
	c := New(Limits{MaxInFlight: 2})
	a, b := enter(t, c), enter(t, c)
	_, err := c.Enter()
	requireLimited(t, err, InFlightRetryAfter.Milliseconds())
	assert.Equal(t, 2, c.InFlight(), "a refused call holds no slot")
	c.Leave(a)
	assert.Equal(t, 1, c.InFlight())
	a = enter(t, c)
	_, err = c.Enter()
	require.Error(t, err)
	c.Leave(a)
	c.Leave(b)
	c.Leave(Ticket{}) // a refused call's ticket gives back nothing
	assert.Zero(t, c.InFlight())
}

// TestInFlightLimitHoldsUnderRacingCallers: however callers race, no more
// than the limit are ever inside, and every slot comes back, with a fixed
// limit and with an adaptive one moving under them.
func TestInFlightLimitHoldsUnderRacingCallers(t *testing.T) {
	for _, adaptive := range []bool{false, true} {
		t.Run(fmt.Sprint("adaptive=", adaptive), func(t *testing.T) {
			const ceiling = 8
			c := New(Limits{MaxInFlight: ceiling, Adaptive: adaptive, MinInFlight: 2})
			var inside, most, admitted, refused atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					for i := range 500 {
						tk, err := c.Enter()
						if err != nil {
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
						if i%50 == 0 {
							time.Sleep(time.Duration(g%4) * time.Millisecond) // latency that varies
						}
						admitted.Add(1)
						inside.Add(-1)
						if i%97 == 0 {
							c.Acquired(time.Duration(g%4) * 5 * time.Millisecond) // waits that move an adaptive limit
						}
						c.Leave(tk)
					}
				})
			}
			wg.Wait()
			assert.LessOrEqual(t, most.Load(), int64(ceiling))
			assert.Equal(t, int64(64*500), admitted.Load()+refused.Load())
			assert.Positive(t, admitted.Load())
			assert.Positive(t, refused.Load())
			assert.Zero(t, c.InFlight())
			assert.GreaterOrEqual(t, c.Limit(), 2)
			assert.LessOrEqual(t, c.Limit(), ceiling)
		})
	}
}

func TestShedTurnsTheQueueBoundIntoRateLimited(t *testing.T) {
	requireLimited(t, Shed(fmt.Errorf("decide: %w", store.ErrQueueBound)), InFlightRetryAfter.Milliseconds())
	other := fmt.Errorf("x: %w", store.ErrBusy)
	assert.Same(t, other, Shed(other), "the store's own timeout stays UNAVAILABLE")
	assert.NoError(t, Shed(nil))
}

func TestTenantBucketRefusesPastItsBurstAndRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{TenantRate: 2, TenantBurst: 3, Tenants: map[string]Bucket{"bigco": {Rate: 100, Burst: 10}}})
	c.now = func() time.Time { return now }
	for range 3 {
		require.NoError(t, c.Rate("acme"))
	}
	err := c.Rate("acme")
	requireLimited(t, err, 500) // a token every 500 ms
	require.NoError(t, c.Rate("globex"), "another tenant has its own bucket")
	for range 10 {
		require.NoError(t, c.Rate("bigco"), "a tenant's own bucket overrides the default")
	}
	requireLimited(t, c.Rate("bigco"), 10)
	now = now.Add(500 * time.Millisecond)
	require.NoError(t, c.Rate("acme"))
	require.Error(t, c.Rate("acme"))
	require.NoError(t, c.Rate(""), "a method without a tenant is not limited by a tenant's bucket")
}

func TestGlobalBucketLimitsEveryoneAndRefundsTheTenantToken(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{TenantRate: 1, TenantBurst: 2, GlobalRate: 10, GlobalBurst: 3})
	c.now = func() time.Time { return now }
	require.NoError(t, c.Rate("acme"))
	require.NoError(t, c.Rate("globex"))
	require.NoError(t, c.Rate(""))
	requireLimited(t, c.Rate("globex"), 100) // the global bucket: a token every 100 ms
	now = now.Add(100 * time.Millisecond)
	require.NoError(t, c.Rate("globex"), "the refused call did not spend globex's second token")
}

func TestIdleTenantsBucketsAreDroppedWhenTheMapIsFull(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{TenantRate: 1000, TenantBurst: 1})
	c.now = func() time.Time { return now }
	for i := range maxTenants {
		require.NoError(t, c.Rate(string(rune('a'+i%26))+time.Duration(i).String()))
	}
	now = now.Add(time.Second) // every bucket is full again
	require.NoError(t, c.Rate("newcomer"))
	assert.Len(t, c.buckets, 1)
}

func TestNoLimitsAdmitEverything(t *testing.T) {
	for _, c := range []*Controller{nil, New(Limits{})} {
		for range 100 {
			tk, err := c.Enter()
			require.NoError(t, err)
			require.NoError(t, c.Rate("acme"))
			c.Leave(tk)
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
