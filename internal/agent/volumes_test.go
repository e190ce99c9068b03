package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVolumesGrowAndGoAndAreReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, applyVolumes(dir, json.RawMessage(`{"volumes":[{"serial":"v1","sizeGiB":1},{"serial":"v2","sizeGiB":2}]}`)))
	vs, files := scanVolumes(dir)
	assert.Len(t, files, 2)
	assert.EqualValues(t, 3<<30, vs.ReservedBytes)
	assert.Positive(t, vs.OutstandingBytes, "sparse files may still write")
	assert.Positive(t, vs.AvailableBytes)
	// A bad size keeps the file as it is; a volume left out goes.
	err := applyVolumes(dir, json.RawMessage(`{"volumes":[{"serial":"v1","sizeGiB":999999999999}]}`))
	assert.ErrorContains(t, err, "v1")
	assert.Equal(t, []string{"v1.raw"}, names(t, dir))
	// No volumes key: the store is left as it is.
	require.NoError(t, applyVolumes(dir, json.RawMessage(`{"instances":[]}`)))
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

func FuzzParseVolumes(f *testing.F) {
	f.Add([]byte(`{"volumes":[{"serial":"v1","sizeGiB":1}]}`))
	f.Add([]byte(`{"volumes":[{"serial":"../../etc/passwd","sizeGiB":1},{"serial":"v","sizeGiB":9223372036854775807}]}`))
	f.Add([]byte(`{"volumes":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		want, present, _ := parseVolumes(body)
		if !present {
			require.Empty(t, want)
			return
		}
		for serial, size := range want {
			require.Equal(t, serial, filepath.Base(serial), "a serial is a file name")
			require.Regexp(t, serialRe, serial)
			require.True(t, size == 0 || (size >= 1<<30 && size <= MaxVolumeGiB<<30), "size %d", size)
		}
	})
}
