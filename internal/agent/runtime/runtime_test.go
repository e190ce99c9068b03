package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

func TestRecordingAppliesAndLogs(t *testing.T) {
	r := &Recording{Dir: t.TempDir()}
	st, err := r.Apply(t.Context(), 3, json.RawMessage(`{"instances":[{"id":"a","state":"running"},{"id":"b","state":"deleted"}]}`))
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, "a", st[0].ID)
	b, err := os.ReadFile(filepath.Join(r.Dir, "applied.log"))
	require.NoError(t, err)
	assert.Equal(t, "3\n", string(b))
	_, err = r.Apply(t.Context(), 4, json.RawMessage(`{"instances":[{"id":"a","state":"flying"}]}`))
	assert.ErrorContains(t, err, "state")
}

func FuzzParseSpec(f *testing.F) {
	f.Add([]byte(`{"instances":[{"id":"a","state":"running","vcpu":2}]}`))
	f.Add([]byte(`{"instances":[{"id":"a","state":"running"},{"id":"a","state":"paused"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := ParseSpec(body)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, in := range s.Instances {
			require.NotEmpty(t, in.ID)
			require.False(t, seen[in.ID])
			seen[in.ID] = true
			require.True(t, strings.Contains("running stopped paused deleted", in.State))
		}
	})
}

func TestRecordingReportsWhatItAppliedBeforeARestart(t *testing.T) {
	dir := t.TempDir()
	_, err := (&Recording{Dir: dir}).Apply(t.Context(), 5, json.RawMessage(`{"instances":[{"id":"a","state":"paused"}]}`))
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
