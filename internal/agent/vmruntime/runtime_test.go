package vmruntime

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

func TestRecordingAppliesAndLogs(t *testing.T) {
	r := &Recording{Dir: t.TempDir()}
	st, err := r.Apply(t.Context(), 3, agentproto.SpecBody{Instances: []agentproto.InstanceSpec{{ID: "a", State: "running"}, {ID: "b", State: "deleted"}}})
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, "a", st[0].ID)
	b, err := os.ReadFile(filepath.Join(r.Dir, "applied.log"))
	require.NoError(t, err)
	assert.Equal(t, "3\n", string(b))
	_, err = r.Apply(t.Context(), 4, agentproto.SpecBody{Instances: []agentproto.InstanceSpec{{ID: "a", State: "flying"}}})
	assert.ErrorContains(t, err, "state")
}

func TestRecordingReportsWhatItAppliedBeforeARestart(t *testing.T) {
	dir := t.TempDir()
	_, err := (&Recording{Dir: dir}).Apply(t.Context(), 5, agentproto.SpecBody{Instances: []agentproto.InstanceSpec{{ID: "a", State: "paused"}}})
	require.NoError(t, err)
	st := (&Recording{Dir: dir}).Observe(t.Context())
	assert.Equal(t, []agentproto.InstanceStatus{{ID: "a", State: "paused"}}, st)
}

// The host's qemu passes the check the daemon makes at start (VM tests
// need it on PATH anyway).
func TestCheckQEMUOnThisHost(t *testing.T) {
	v, err := CheckQEMU(t.Context())
	require.NoError(t, err)
	assert.Contains(t, v, "QEMU emulator version")
}
