package sinks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"computeplane/internal/config"
)

// Content types of HTTP sink requests: events in CloudEvents batch content
// mode, audit rows as a JSON array.
const (
	ContentTypeEvents = "application/cloudevents-batch+json"
	ContentTypeAudit  = "application/json"
)

// HTTPTimeout bounds one POST to an HTTP sink.
const HTTPTimeout = 10 * time.Second

// HTTP posts each batch as one JSON array; any 2xx answer accepts it. 3xx
// (redirects are not followed), 408, 429 and 5xx are failures worth
// retrying; any other 4xx is permanent.
type HTTP struct {
	id, kind, url string
	client        *http.Client
	timeout       time.Duration
}

var _ Sink = (*HTTP)(nil)

// NewHTTP returns an HTTP sink posting to url; client nil uses a client of
// its own that follows no redirects.
func NewHTTP(kind, id, url string, client *http.Client) *HTTP {
	if client == nil {
		client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	return &HTTP{id: id, kind: kind, url: url, client: client, timeout: HTTPTimeout}
}

// ID implements Sink.
func (s *HTTP) ID() string { return s.id }

// Kind implements Sink.
func (s *HTTP) Kind() string { return s.kind }

// Send implements Sink: one POST of the whole batch.
func (s *HTTP) Send(ctx context.Context, batch []Record) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(batchJSON(batch)))
	if err != nil {
		return Permanent(err)
	}
	ct := ContentTypeEvents
	if s.kind == KindAudit {
		ct = ContentTypeAudit
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set("User-Agent", "computeplane-sinks")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("sinks: POST %s: %w", s.id, err)
	}
	// Drain a little so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c == http.StatusRequestTimeout, c == http.StatusTooManyRequests, c < 400 || c >= 500:
		return fmt.Errorf("sinks: %s answered %d", s.id, c)
	default:
		return Permanent(fmt.Errorf("sinks: %s answered %d", s.id, c))
	}
}

// File appends each row as one JSON line and syncs the file once per
// batch, so an accepted batch is on disk.
type File struct {
	id, kind, path string
	mu             sync.Mutex
}

var _ Sink = (*File)(nil)

// NewFile returns a file sink appending to path (created 0640 when absent).
func NewFile(kind, id, path string) *File { return &File{id: id, kind: kind, path: path} }

// ID implements Sink.
func (s *File) ID() string { return s.id }

// Kind implements Sink.
func (s *File) Kind() string { return s.kind }

// Send implements Sink.
func (s *File) Send(_ context.Context, batch []Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("sinks: %s: %w", s.id, err)
	}
	var buf bytes.Buffer
	// A crash in the middle of a write leaves a torn last line; start on a
	// line of our own so that the next row stays readable.
	if torn, err := endsTorn(s.path); err != nil {
		_ = f.Close()
		return fmt.Errorf("sinks: %s: %w", s.id, err)
	} else if torn {
		buf.WriteByte('\n')
	}
	for _, r := range batch {
		buf.Write(r.Body)
		buf.WriteByte('\n')
	}
	_, werr := f.Write(buf.Bytes())
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("sinks: %s: %w", s.id, err)
	}
	return nil
}

// endsTorn reports whether the file is non-empty and does not end with a
// newline.
func endsTorn(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return false, err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, st.Size()-1); err != nil {
		return false, err
	}
	return last[0] != '\n', nil
}

// FromConfig builds the configured sinks: events sinks, then audit sinks,
// each in configuration order.
func FromConfig(c config.Sinks) ([]Sink, error) {
	var out []Sink
	for _, group := range []struct {
		kind string
		list []config.Sink
	}{{KindEvents, c.Events}, {KindAudit, c.Audit}} {
		for _, s := range group.list {
			switch s.Kind {
			case config.SinkHTTP:
				out = append(out, NewHTTP(group.kind, s.ID, s.URL, nil))
			case config.SinkFile:
				out = append(out, NewFile(group.kind, s.ID, s.Path))
			default:
				return nil, fmt.Errorf("sinks: %s sink %s: unknown transport %q", group.kind, s.ID, s.Kind)
			}
		}
	}
	return out, nil
}
