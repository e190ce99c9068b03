package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// examplePlugin builds plugins/example once per test process.
var examplePlugin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "plugin-example-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "example")
	cmd := exec.Command("go", "build", "-o", bin, "computeplane/plugins/example")
	cmd.Stderr = os.Stderr
	return bin, cmd.Run()
})

// ExamplePlugin builds the example plugin (plugins/example) once per test
// process and returns its executable and SHA-256.
func ExamplePlugin(t testing.TB) (path, sum string) {
	t.Helper()
	bin, err := examplePlugin()
	require.NoError(t, err, "go build ./plugins/example")
	b, err := os.ReadFile(bin)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return bin, hex.EncodeToString(s[:])
}

// ExamplePluginConfig is the plugins option (a YAML block) that runs the
// example plugin with a data directory of the test's own.
func ExamplePluginConfig(t testing.TB) string {
	t.Helper()
	bin, sum := ExamplePlugin(t)
	return "plugins:\n  - {id: example, path: '" + bin + "', sha256: '" + sum + "', dataDir: '" + t.TempDir() + "'}\n"
}
