package bundle

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const pemKey = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIPlantedKeyMaterialPlantedKeyMaterialAAAAoAoGCCqGSM49\nAwEHoUQDQgAE\n-----END EC PRIVATE KEY-----"

// planted are secrets in every shape the scrubber knows, with the one
// value that must not survive it.
var planted = map[string]string{
	"password=hunter2-planted":                          "hunter2-planted",
	`{"apiKey": "ak-planted-123456"}`:                   "ak-planted-123456",
	"Authorization: Bearer bt-planted-abcdef":           "bt-planted-abcdef",
	"dial postgres://svc:pw-planted-99@db:5432/x":       "pw-planted-99",
	"GET /b?X-Amz-Signature=sig-planted-0a0a&x=1":       "sig-planted-0a0a",
	"webhook whsec_plantedplantedplanted":               "whsec_plantedplantedplanted",
	"compute-agent join --token jt-planted-flag-777":    "jt-planted-flag-777",
	"token file holds cjt_0123456789abcdefghjkmnpqrstv": "cjt_0123456789abcdefghjkmnpqrstv",
	"key cpk_0123456789abcdef_0123456789abcdefghjkmnpq": "cpk_0123456789abcdef_0123456789abcdefghjkmnpq",
	"client_secret: 'cs-planted-quoted'":                "cs-planted-quoted",
	pemKey:                                              "PlantedKeyMaterial",
	"a known value kv-planted-known appears bare":       "kv-planted-known",
}

func TestScrubText(t *testing.T) {
	t.Parallel()
	s := NewScrubber("kv-planted-known", "ab") // too short to scrub by value
	for in, secret := range planted {
		out, n := s.Text([]byte(in))
		assert.NotContains(t, string(out), secret, in)
		assert.Contains(t, string(out), Redacted, in)
		assert.Positive(t, n, in)
	}
	out, n := s.Text([]byte("level=INFO msg=\"session up\" gateway=gw-1 abc"))
	assert.Equal(t, "level=INFO msg=\"session up\" gateway=gw-1 abc", string(out), "nothing secret, nothing changed")
	assert.Zero(t, n)
}

func TestScrubJSON(t *testing.T) {
	t.Parallel()
	s := NewScrubber()
	out, n := s.JSON([]byte(`{"nodeId":"node_1","generation":12345678901234,"spec":{"env":{"DB_URL":"opaque-planted-1"},"userData":"#cloud-config opaque-planted-2",
		"clientKey":"opaque-planted-3","note":"password=opaque-planted-4"}}`))
	for _, secret := range []string{"opaque-planted-1", "opaque-planted-2", "opaque-planted-3", "opaque-planted-4"} {
		assert.NotContains(t, string(out), secret)
	}
	assert.Equal(t, 4, n)
	assert.Contains(t, string(out), `"DB_URL": "[REDACTED]"`, "keys stay, values go")
	assert.Contains(t, string(out), "12345678901234", "numbers keep their digits")
	assert.Contains(t, string(out), "node_1")
}

// TestCollect builds a bundle from an agent directory with secrets planted
// in its files, environment and command line, and reads it back.
func TestCollect(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(dir, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, []byte(data), 0o600))
	}
	write("node.key", pemKey+"\n")
	write("state.json", `{"nodeId":"node_x","apiUrl":"https://api.example"}`)
	var log strings.Builder
	for in := range planted {
		log.WriteString("level=INFO msg=" + in + "\n")
	}
	write("logs/agent.log", log.String())
	write("runtime/vms/inst_1/console.log", "boot ok\nSECRET_VALUE=kv-planted-known\n")
	write("runtime/vms/inst_1/qemu.log", "qemu: started\n")
	write("runtime/vms/inst_1/config.json", `{"id":"inst_1","cmdline":"console=ttyS0 token=cmd-planted-1"}`)
	write("runtime/vms/inst_1/disk.raw", "DISKBYTES-planted")
	write("runtime/vms/inst_1/snapshots/s1/state.json", `{"x":"snap-planted"}`)
	write("commands/cmd_1.json", `{"output":"journal-planted"}`)
	out := filepath.Join(dir, "bundles")
	r, err := Collect(t.Context(), Options{BundleID: "sbun_1", NodeID: "node_x", Version: "test", AgentDir: dir, RuntimeDir: filepath.Join(dir, "runtime"),
		LogDir: filepath.Join(dir, "logs"), Environ: []string{"PATH=/bin", "COMPUTE_AGENT_TOKEN=env-planted-token", "HTTP_PROXY=http://u:proxy-planted@p:3128"},
		Args: []string{"compute-agent", "run", "--join-token", "arg-planted-1", "--secret=arg-planted-2"}, Scrubber: NewScrubber("kv-planted-known"),
		MaxBytes: 1 << 20, Out: out, Now: time.Now()})
	require.NoError(t, err)
	files := readBundle(t, r.Path)
	all := strings.Join(mapValues(files), "\n")
	for _, secret := range []string{"kv-planted-known", "env-planted-token", "proxy-planted", "arg-planted-1", "arg-planted-2", "cmd-planted-1",
		"DISKBYTES-planted", "snap-planted", "journal-planted", "BEGIN EC PRIVATE KEY"} {
		assert.NotContains(t, all, secret)
	}
	for _, p := range planted {
		assert.NotContains(t, all, p)
	}
	for _, name := range []string{"manifest.json", "agent/state.json", "agent/logs/agent.log", "agent/environment.txt", "agent/cmdline.txt",
		"runtime/vms/inst_1/console.log", "runtime/vms/inst_1/qemu.log", "runtime/vms/inst_1/config.json", "system/uname.json", "system/meminfo",
		"system/interfaces.json", "system/disks.txt"} {
		assert.Contains(t, files, "sbun_1/"+name)
	}
	assert.Contains(t, files["sbun_1/runtime/vms/inst_1/console.log"], "boot ok")
	var m Manifest
	require.NoError(t, json.Unmarshal([]byte(files["sbun_1/manifest.json"]), &m))
	assert.Equal(t, r.Redactions, m.Redactions)
	assert.Positive(t, m.Redactions)
	assert.Equal(t, r.Entries, len(files))

	// Above maxBytes: refused, nothing kept.
	_, err = Collect(t.Context(), Options{BundleID: "sbun_2", AgentDir: dir, LogDir: filepath.Join(dir, "logs"), MaxBytes: 100, Out: out, Now: time.Now()})
	require.ErrorIs(t, err, ErrTooLarge)
	left, _ := os.ReadDir(out)
	assert.Len(t, left, 1, "only the first bundle")
}

func readBundle(t *testing.T, path string) map[string]string {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[h.Name] = string(b)
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
