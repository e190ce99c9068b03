package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

func TestVolumesGrowAndGoAndAreReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, applyVolumes(dir, []agentproto.VolumeSpec{{Serial: "v1", SizeGiB: 1}, {Serial: "v2", SizeGiB: 2}}))
	vs, files := scanVolumes(dir)
	assert.Len(t, files, 2)
	assert.EqualValues(t, 3<<30, vs.ReservedBytes)
	assert.Positive(t, vs.OutstandingBytes, "sparse files may still write")
	assert.Positive(t, vs.AvailableBytes)
	// A bad size keeps the file as it is; a volume left out goes.
	err := applyVolumes(dir, []agentproto.VolumeSpec{{Serial: "v1", SizeGiB: 999999999999}})
	assert.ErrorContains(t, err, "v1")
	assert.Equal(t, []string{"v1.raw"}, names(t, dir))
	// No volumes key: the store is left as it is.
	var spec agentproto.SpecBody
	require.NoError(t, json.Unmarshal([]byte(`{"instances":[]}`), &spec))
	require.NoError(t, applyVolumes(dir, spec.Volumes))
	_, files = scanVolumes(dir)
	assert.Len(t, files, 1)
}

func names(t *testing.T, dir string) []string {
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func FuzzWantVolumes(f *testing.F) {
	f.Add([]byte(`{"volumes":[{"serial":"v1","sizeGiB":1}]}`))
	f.Add([]byte(`{"volumes":[{"serial":"../../etc/passwd","sizeGiB":1},{"serial":"v","sizeGiB":9223372036854775807}]}`))
	f.Add([]byte(`{"volumes":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var spec agentproto.SpecBody
		if json.Unmarshal(body, &spec) != nil {
			return // the message is refused before it reaches the store
		}
		want, _ := wantVolumes(spec.Volumes)
		for serial, size := range want {
			require.Equal(t, serial, filepath.Base(serial), "a serial is a file name")
			require.Regexp(t, serialRe, serial)
			require.True(t, size == 0 || (size >= 1<<30 && size <= MaxVolumeGiB<<30), "size %d", size)
		}
	})
}
