package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// BundleFetchTimeout bounds the download of a support bundle.
const BundleFetchTimeout = 10 * time.Minute

// fetchBundle downloads a ready support bundle through the presigned GET
// of supportBundles.get's answer into the local file to (- is stdout).
func fetchBundle(data []byte, to string, s Streams) (int, bool, error) {
	var b struct {
		BundleID    string
		State       string
		DownloadURL *string
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return 0, true, err
	}
	if b.DownloadURL == nil {
		fmt.Fprintf(s.Stderr, "error: support bundle %s is %s: only a ready bundle can be downloaded\n", b.BundleID, b.State)
		return ExitState, true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), BundleFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *b.DownloadURL, nil)
	if err != nil {
		return 0, true, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ExitError, true, fmt.Errorf("downloading support bundle %s: %w", b.BundleID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ExitError, true, fmt.Errorf("downloading support bundle %s: the blob store answered %s", b.BundleID, resp.Status)
	}
	w := s.Stdout
	if to != "-" {
		f, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return 0, true, err
		}
		defer f.Close()
		w = f
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return ExitError, true, fmt.Errorf("downloading support bundle %s: %w", b.BundleID, err)
	}
	return ExitOK, true, nil
}
