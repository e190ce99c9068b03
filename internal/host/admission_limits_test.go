package host

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"computeplane/internal/config"
)

// The adaptive options reach the controller: the ceiling and floor from
// the pool, the acquire target as configured.
func TestAdmissionLimitsCarryTheAdaptiveOptions(t *testing.T) {
	l := admissionLimits(config.Admission{
		MaxInFlight: config.AutoInFlight, MinInFlight: config.AutoInFlight, Adaptive: true,
		AcquireTarget: 3 * time.Millisecond,
	}, 8)
	assert.Equal(t, config.AdaptiveInFlightPerConn*8, l.MaxInFlight)
	assert.Equal(t, 8, l.MinInFlight)
	assert.Equal(t, 3*time.Millisecond, l.AcquireTarget)
}
