package admission

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The gauges read the controller's state at each scrape.
func TestRegisterExposesTheLawsState(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(Limits{MaxInFlight: 4, QueueTarget: 5 * time.Millisecond})
	c.now = func() time.Time { return now }
	reg := prometheus.NewRegistry()
	require.NoError(t, c.Register(reg))
	tk, err := c.EnterAt(now)
	require.NoError(t, err)
	c.queue.share = 0.25
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
	}
	assert.Equal(t, map[string]float64{
		"compute_admission_in_flight":          1,
		"compute_admission_in_flight_limit":    4,
		"compute_admission_wait_refused_share": 0.25,
	}, got)
	c.Leave(tk)
	var nilController *Controller
	assert.NoError(t, nilController.Register(reg))
}
