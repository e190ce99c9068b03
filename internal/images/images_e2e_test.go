package images_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/testenv"
)

const digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func manifest(id, format, extra string) string {
	return `{"id":"` + id + `","format":"` + format + `","sizeBytes":1048576,"sha256":"` + digest + `","location":"` + id + `.img"` + extra + `}`
}

func start(t *testing.T, yaml string) *computeclient.Client {
	t.Helper()
	env := testenv.Start(t, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(t, yaml)))
	return env.Client(t, computeclient.WithToken(env.Key(t, "acme", "ann", "viewer")))
}

func TestDirectorySource(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, body := range map[string]string{
		"b.json":       manifest("debian-12", "raw", ""),
		"a.json":       manifest("alpine", "kernel+initrd", `,"initrd":"alpine.initrd","cmdline":"console=ttyS0"`),
		"broken.json":  `{"id":`,
		"bad-fmt.json": manifest("vmdk", "vmdk", ""),
		"notes.txt":    "not a manifest",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
	}
	c := start(t, "images: {dir: "+dir+"}\n")
	list, err := c.ImagesList(t.Context(), &client.ImagesListInput{TenantId: "acme"})
	require.NoError(t, err)
	require.Len(t, list.Data.Items, 2, "manifests that do not check are left out")
	assert.Equal(t, "alpine", list.Data.Items[0].ImageId)
	assert.Equal(t, filepath.Join(dir, "alpine.initrd"), list.Data.Items[0].Initrd.Value, "relative to the directory")

	got, err := c.ImagesGet(t.Context(), &client.ImagesGetInput{TenantId: "acme", ImageId: "debian-12"})
	require.NoError(t, err)
	assert.Equal(t, "raw", string(got.Data.Format))
	assert.Equal(t, filepath.Join(dir, "debian-12.img"), got.Data.Location)
	assert.True(t, got.Data.Initrd.Null)
	_, err = c.ImagesGet(t.Context(), &client.ImagesGetInput{TenantId: "acme", ImageId: "nope"})
	assert.Equal(t, "NOT_FOUND", testenv.APIError(t, err).Code)

	// A manifest added later is seen at once.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "c.json"), []byte(manifest("ubuntu", "qcow2", "")), 0o600))
	_, err = c.ImagesGet(t.Context(), &client.ImagesGetInput{TenantId: "acme", ImageId: "ubuntu"})
	require.NoError(t, err)
}

func TestHTTPIndexSource(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	idx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		_, _ = w.Write([]byte(`{"images":[` + strings.Replace(manifest("debian-12", "raw", ""), `"debian-12.img"`, `"https://images.example.com/d.img"`, 1) + `]}`))
	}))
	defer idx.Close()
	fail.Store(true)
	c := start(t, "images: {url: '"+idx.URL+"/index.json'}\n")
	_, err := c.ImagesList(t.Context(), &client.ImagesListInput{TenantId: "acme"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "UNAVAILABLE", e.Code, "an index that fails")
	require.NotNil(t, e.RetryAfterMs)
	fail.Store(false)
	got, err := c.ImagesGet(t.Context(), &client.ImagesGetInput{TenantId: "acme", ImageId: "debian-12"})
	require.NoError(t, err)
	assert.Equal(t, "https://images.example.com/d.img", got.Data.Location)
}

func TestNoSourceIsInvalidConfig(t *testing.T) {
	t.Parallel()
	c := start(t, "{}\n")
	_, err := c.ImagesList(t.Context(), &client.ImagesListInput{TenantId: "acme"})
	e := testenv.APIError(t, err)
	assert.Equal(t, "INVALID_CONFIG", e.Code)
	assert.Contains(t, e.Message, "no image source")
	_, err = c.ImagesGet(t.Context(), &client.ImagesGetInput{TenantId: "acme", ImageId: "debian-12"})
	assert.Equal(t, "INVALID_CONFIG", testenv.APIError(t, err).Code)
}
