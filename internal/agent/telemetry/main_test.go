package telemetry

import (
	"testing"

	"computeplane/internal/qemu/qemutest"
)

// The package fails when a VM one of its tests booted outlives them.
func TestMain(m *testing.M) { qemutest.Main(m) }
