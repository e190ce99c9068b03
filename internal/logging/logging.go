// Package logging builds the process logger: log/slog JSON on stderr, with
// the request id of the call added to every line logged with its context.
package logging

import (
	"context"
	"io"
	"log/slog"

	"computeplane/internal/reqmeta"
)

// New returns a JSON logger writing to w at level.
func New(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(&requestHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})})
}

// ParseLevel maps debug, info, warn and error to slog levels (warn otherwise).
func ParseLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelWarn
	}
	return l
}

// requestHandler adds requestId (and traceparent when valid) from the
// context, so code that logs with a call's context needs no plumbing.
type requestHandler struct{ slog.Handler }

func (h *requestHandler) Handle(ctx context.Context, r slog.Record) error {
	if m := reqmeta.FromContext(ctx); m.RequestID != "" {
		r.AddAttrs(slog.String("requestId", m.RequestID))
		if m.Traceparent != "" {
			r.AddAttrs(slog.String("traceparent", m.Traceparent))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h *requestHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &requestHandler{h.Handler.WithAttrs(attrs)}
}

func (h *requestHandler) WithGroup(name string) slog.Handler {
	return &requestHandler{h.Handler.WithGroup(name)}
}
