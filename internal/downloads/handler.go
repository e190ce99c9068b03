package downloads

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"computeplane/gen/api"
	"computeplane/internal/release"
	"computeplane/internal/rpc"
)

// Bounds of the route.
const (
	// SourceTimeout bounds each call to the source (listing, opening).
	SourceTimeout = 10 * time.Second
	// StallTimeout is how long one write of a download may take: a client
	// that stops reading is cut off, a slow one that keeps reading is not
	// (a binary takes longer than the API's response deadline on a slow
	// line).
	StallTimeout = 30 * time.Second
)

// Headers of an artifact's answer.
const (
	HeaderDigest    = "Repr-Digest"
	HeaderSignature = "X-Release-Signature"
	HeaderVersion   = "X-Release-Version"
)

// Handler serves GET {BasePath}/downloads/<agent>/<version>/<file>.
type Handler struct {
	BasePath string
	Source   Source
	Log      *slog.Logger
}

// Prefix is the route's path prefix under basePath.
func Prefix(basePath string) string { return basePath + "/downloads/" }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeJSON(w, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, "downloads answer GET and HEAD only")
		return
	}
	agent, version, file, err := parse(strings.TrimPrefix(r.URL.Path, Prefix(h.BasePath)))
	if err != nil {
		writeJSON(w, http.StatusNotFound, api.CodeNotFound, err.Error())
		return
	}
	platform, sibling := file, ""
	for _, s := range []string{release.ChecksumSuffix, release.SignatureSuffix} {
		if p, ok := strings.CutSuffix(file, s); ok {
			platform, sibling = p, s
		}
	}
	if err := release.CheckPlatform(platform); err != nil {
		writeJSON(w, http.StatusNotFound, api.CodeNotFound, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), SourceTimeout)
	defer cancel()
	resolved := version
	if version == release.Latest {
		vs, err := h.Source.Versions(ctx, agent, platform)
		if err != nil {
			h.unavailable(w, r, err)
			return
		}
		if resolved = release.Highest(vs); resolved == "" {
			writeJSON(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no release of %s for %s", agent, platform))
			return
		}
	}
	a, err := h.Source.Open(ctx, agent, resolved, platform)
	if errors.Is(err, ErrNotFound) {
		writeJSON(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no release %s of %s for %s", resolved, agent, platform))
		return
	}
	if err != nil {
		h.unavailable(w, r, err)
		return
	}
	defer a.Content.Close()

	hd := w.Header()
	hd.Set(HeaderVersion, resolved)
	hd.Set(HeaderDigest, "sha-256=:"+b64.EncodeToString(a.SHA256[:])+":")
	hd.Set(HeaderSignature, "ed25519=:"+b64.EncodeToString(a.Signature)+":")
	hd.Set("Content-Location", Prefix(h.BasePath)+release.Path(agent, resolved, file))
	if version == release.Latest {
		hd.Set("Cache-Control", "no-cache") // latest moves
	} else {
		hd.Set("Cache-Control", "public, max-age=86400") // a version's bytes never change
	}
	switch sibling {
	case release.ChecksumSuffix:
		hd.Set("Content-Type", "text/plain; charset=utf-8")
		http.ServeContent(w, r, "", a.ModTime, bytes.NewReader(release.ChecksumFile(platform, a.SHA256)))
		return
	case release.SignatureSuffix:
		hd.Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", a.ModTime, bytes.NewReader(a.Signature))
		return
	}
	hd.Set("Content-Type", "application/octet-stream")
	hd.Set("ETag", fmt.Sprintf(`"sha256-%x"`, a.SHA256))
	// ServeContent answers Range, If-None-Match and If-Range requests.
	http.ServeContent(&stallWriter{ResponseWriter: w}, r, "", a.ModTime, a.Content)
}

// parse splits <agent>/<version>/<file>, each checked.
func parse(rest string) (agent, version, file string, err error) {
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", "", "", errors.New("a download is <agent>/<version>/<os>-<arch>")
	}
	agent, version, file = parts[0], parts[1], parts[2]
	if err := release.CheckAgent(agent); err != nil {
		return "", "", "", err
	}
	if version != release.Latest {
		if err := release.CheckVersion(version); err != nil {
			return "", "", "", err
		}
	}
	return agent, version, file, nil
}

func (h *Handler) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	h.Log.WarnContext(r.Context(), "downloads: the release source failed", "error", err.Error())
	rpc.WriteError(w, h.Log, api.Errorf(api.CodeUnavailable, "the release store did not answer; try again").
		WithDetails(map[string]any{"retryAfterMs": int64(1000)}))
}

func writeJSON(w http.ResponseWriter, status int, code api.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": string(code), "message": msg}})
}

// stallWriter moves the write deadline before each write: a download is
// bounded by the progress of its reader, not by its size.
type stallWriter struct {
	http.ResponseWriter
}

func (s *stallWriter) Write(p []byte) (int, error) {
	_ = http.NewResponseController(s.ResponseWriter).SetWriteDeadline(time.Now().Add(StallTimeout))
	return s.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *stallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
