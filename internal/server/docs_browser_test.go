package server_test

import (
	"context"
	"net/http"
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
	env := testenv.Start(t)
	dom := dumpDOM(t, env.APIURL+"/docs")
	require.Contains(t, dom, "</html>")
	for _, m := range api.Methods {
		assert.True(t, strings.Contains(dom, m.FullName), "the rendered page names %s", m.FullName)
	}
}

// Searching the reference in a real browser: the page's script runs under
// the server's Content-Security-Policy (its hash allowed) and, given a
// query (?q=, as typed into the search box), leaves only the matching
// methods shown.
func TestDocsSearchFindsAMethod(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	dom := dumpDOM(t, env.APIURL+"/docs?q=pools.offer")
	assert.Contains(t, dom, "1 of ", "the script ran and counted the matches")
	assert.Regexp(t, `<article id="pools\.offer" data-method="pools\.offer"[^>]*>`, dom)
	assert.NotRegexp(t, `<article id="pools\.offer"[^>]* hidden`, dom, "the match is shown")
	assert.Regexp(t, `<article id="sites\.create"[^>]* hidden`, dom, "others are hidden")
}

func TestRootRedirectsToTheDocs(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(env.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusFound, resp.StatusCode)
	assert.Equal(t, "/api/compute/docs", resp.Header.Get("Location"))
	resp, err = c.Get(env.URL + "/nothing-here")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "only the root redirects")
}

// dumpDOM loads url in headless Chromium, runs its scripts and returns the
// DOM; the test is skipped where Chromium is not installed (.ci/run
// installs it).
func dumpDOM(t *testing.T, url string) string {
	t.Helper()
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium); .ci/run installs it")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, browser,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--dump-dom", url).Output()
	require.NoError(t, err)
	return string(out)
}
