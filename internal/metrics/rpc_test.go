package metrics

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDenied(t *testing.T) {
	for status, want := range map[int]bool{
		200: false, 400: false, 401: true, 403: true, 404: false,
		409: false, 429: true, 500: false, 503: false,
	} {
		assert.Equal(t, want, Denied(status), status)
	}
}

func TestRPCObserve(t *testing.T) {
	reg := NewRegistry()
	rpc, err := NewRPC(reg)
	require.NoError(t, err)

	rpc.Observe("sites.create", CodeOK, 200, 20*time.Millisecond)
	rpc.Observe("sites.create", CodeOK, 200, 30*time.Millisecond)
	rpc.Observe("sites.create", "UNAUTHENTICATED", 401, time.Millisecond)
	rpc.Observe("sites.create", "ACCESS_DENIED", 403, time.Millisecond)
	rpc.Observe("sites.list", "RATE_LIMITED", 429, time.Millisecond)
	rpc.Observe("sites.list", "INTERNAL_ERROR", 500, -time.Second)
	rpc.Observe("", "", 0, time.Millisecond)

	assert.Equal(t, map[string]float64{
		"code=OK,method=sites.create":              2,
		"code=UNAUTHENTICATED,method=sites.create": 1,
		"code=ACCESS_DENIED,method=sites.create":   1,
		"code=RATE_LIMITED,method=sites.list":      1,
		"code=INTERNAL_ERROR,method=sites.list":    1,
		"code=(unknown),method=(unknown)":          1,
	}, series(t, reg, RPCRequestsTotal))

	assert.Equal(t, map[string]float64{
		"code=UNAUTHENTICATED,method=sites.create": 1,
		"code=ACCESS_DENIED,method=sites.create":   1,
		"code=RATE_LIMITED,method=sites.list":      1,
	}, series(t, reg, RPCDeniedTotal))

	assert.Equal(t, map[string]float64{
		"method=sites.create": 4,
		"method=sites.list":   2,
		"method=(unknown)":    1,
	}, series(t, reg, RPCDurationSeconds))

	// Duration sums are in seconds; the negative duration counts as 0.
	fams, err := reg.Prometheus().Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != RPCDurationSeconds {
			continue
		}
		for _, m := range f.GetMetric() {
			switch m.GetLabel()[0].GetValue() {
			case "sites.create":
				assert.InDelta(t, 0.052, m.GetHistogram().GetSampleSum(), 1e-9)
			case "sites.list":
				assert.InDelta(t, 0.001, m.GetHistogram().GetSampleSum(), 1e-9)
			}
		}
	}
}

func TestRPCNilAndDuplicate(t *testing.T) {
	var rpc *RPC
	assert.NotPanics(t, func() { rpc.Observe("m", CodeOK, 200, time.Second) })

	reg := NewRegistry()
	_, err := NewRPC(reg)
	require.NoError(t, err)
	_, err = NewRPC(reg)
	require.Error(t, err)
}

func TestRPCPartialRegistrationRollback(t *testing.T) {
	reg := NewRegistry()
	// Occupy the last name so NewRPC fails after registering the first two.
	reg.MustNewCounterVec(rpcDeniedOpts(), []string{"method", "code"})
	_, err := NewRPC(reg)
	require.Error(t, err)
	// The first two were unregistered, so they can be registered again.
	_, err = reg.NewCounterVec(rpcRequestsOpts(), []string{"method", "code"})
	require.NoError(t, err)
	_, err = reg.NewHistogramVec(rpcDurationOpts(), []string{"method"})
	require.NoError(t, err)
}

// TestRPCObserveSuccessAllocatesNothing: once a method's children are
// resolved, recording a successful call and its round trips allocates
// nothing (the envelope records both on every call).
func TestRPCObserveSuccessAllocatesNothing(t *testing.T) {
	rpc, err := NewRPC(NewRegistry())
	require.NoError(t, err)
	rpc.Observe("sites.get", CodeOK, 200, time.Millisecond)
	rpc.RoundTrips("sites.get", 1)
	allocs := testing.AllocsPerRun(100, func() {
		rpc.Observe("sites.get", CodeOK, 200, time.Millisecond)
		rpc.RoundTrips("sites.get", 1)
	})
	assert.Zero(t, allocs)
}
