package server_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
	"computeplane/internal/testenv"
)

// The API reference loads in a real browser (headless Chromium): the page it
// renders, offline and with the server's Content-Security-Policy, names every
// method. .ci/run installs Chromium; elsewhere the test is skipped without it.
func TestDocsLoadInABrowser(t *testing.T) {
	t.Parallel()
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium); .ci/run installs it")
	}
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, browser,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--dump-dom", env.APIURL+"/docs").Output()
	require.NoError(t, err)
	dom := string(out)
	require.Contains(t, dom, "</html>")
	for _, m := range api.Methods {
		assert.True(t, strings.Contains(dom, m.FullName), "the rendered page names %s", m.FullName)
	}
}
