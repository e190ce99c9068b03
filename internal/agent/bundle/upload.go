package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// UploadTimeout bounds one upload.
const UploadTimeout = 10 * time.Minute

// Upload sends the archive at path through a presigned PUT (url and the
// headers signed with it). It refuses, before sending a byte, an archive
// that is not the size and digest the control plane accepted, or is above
// maxBytes: the presigned URL admits exactly that size, and the daemon
// never tries another.
func Upload(ctx context.Context, hc *http.Client, path, url string, headers map[string]string, size, maxBytes int64, sha string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("bundle: the collected archive: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	switch {
	case st.Size() != size:
		return fmt.Errorf("bundle: the archive is %d bytes, not the %d the upload was signed for", st.Size(), size)
	case size > maxBytes:
		return fmt.Errorf("%w: the bundle is %d bytes, above maxBytes %d", ErrTooLarge, size, maxBytes)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha {
		return fmt.Errorf("bundle: the archive changed since it was collected (sha256 %s, not %s)", got, sha)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, UploadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("bundle: the upload URL: %w", err)
	}
	for k, v := range headers {
		if http.CanonicalHeaderKey(k) != "Content-Length" {
			req.Header.Set(k, v)
		}
	}
	req.ContentLength = size
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("bundle: upload: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("bundle: upload: the blob store answered %s: %s", resp.Status, body)
	}
	return nil
}
