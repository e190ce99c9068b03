// Package reqmeta holds the request metadata carried by every call: the
// request id and the W3C trace context (traceparent).
//
// The rules follow the interface specification's "Conventions for every RPC
// method":
//
//   - Request id: the caller's X-Request-Id is used when it is 1 to 128 chars
//     of letters, digits and . _ : -; otherwise a generated id beginning
//     req_ is used. See [RequestID].
//   - Trace: a valid traceparent header (version 00, non-zero ids) is passed
//     on; an invalid one is dropped, not refused. See [Traceparent].
//
// Generated ids ([NewID]) use a ULID layout in lowercase Crockford base32:
// 10 chars of 48-bit millisecond time followed by 16 chars (80 bits) of
// randomness from crypto/rand, so they match the specification's id shapes
// (for example ^site_[0-9a-hjkmnp-tv-z]{26,52}$).
package reqmeta

import (
	"context"
	"crypto/rand"
	"net/http"
	"strings"
	"time"
)

// Header names read and written by the transport.
const (
	// HeaderRequestID is the request id header, read from the caller and
	// returned in the response.
	HeaderRequestID = "X-Request-Id"
	// HeaderTraceparent is the W3C trace context header.
	HeaderTraceparent = "Traceparent"
)

const (
	// MaxRequestIDLen is the longest caller-supplied request id accepted.
	MaxRequestIDLen = 128
	// RequestIDPrefix is the prefix of generated request ids (without "_").
	RequestIDPrefix = "req"
	// IDBodyLen is the number of base32 chars after the prefix and "_" in a
	// generated id.
	IDBodyLen = 26
	// TraceparentLen is the length of a version 00 traceparent header.
	TraceparentLen = 55
)

// Alphabet is the lowercase Crockford base32 alphabet used by generated ids
// (no i, l, o, u).
const Alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// Meta is the request metadata carried in a context.
type Meta struct {
	// RequestID is the caller's valid X-Request-Id or a generated req_ id.
	RequestID string
	// Traceparent is the normalized, valid traceparent header, or "" when
	// the caller sent none or an invalid one.
	Traceparent string
}

// RequestID returns header when it is a valid caller request id (1 to 128
// chars of [A-Za-z0-9._:-]); otherwise it returns a newly generated id of the
// form req_ followed by 26 lowercase Crockford base32 chars.
func RequestID(header string) string {
	if ValidRequestID(header) {
		return header
	}
	return NewID(RequestIDPrefix)
}

// ValidRequestID reports whether s is 1 to 128 chars of [A-Za-z0-9._:-].
func ValidRequestID(s string) bool {
	if len(s) == 0 || len(s) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// NewID returns prefix + "_" + 26 lowercase Crockford base32 chars laid out
// as a ULID: 10 chars encoding the current Unix time in milliseconds (48
// bits) followed by 16 chars encoding 80 random bits from crypto/rand.
// Ids generated in later milliseconds sort after earlier ones.
func NewID(prefix string) string {
	return newIDAt(prefix, time.Now())
}

func newIDAt(prefix string, t time.Time) string {
	var rnd [10]byte
	// crypto/rand.Read never returns an error (it crashes the program
	// irrecoverably if the system source fails).
	_, _ = rand.Read(rnd[:])

	buf := make([]byte, len(prefix)+1+IDBodyLen)
	n := copy(buf, prefix)
	buf[n] = '_'
	body := buf[n+1:]

	// 48-bit milliseconds in 10 chars (50 bits; the top 2 are zero).
	ms := uint64(t.UnixMilli()) & (1<<48 - 1)
	for i := 9; i >= 0; i-- {
		body[i] = Alphabet[ms&31]
		ms >>= 5
	}
	// 80 random bits in 16 chars: two 40-bit groups of 8 chars each.
	for g := 0; g < 2; g++ {
		var v uint64
		for _, b := range rnd[g*5 : g*5+5] {
			v = v<<8 | uint64(b)
		}
		for i := 7; i >= 0; i-- {
			body[10+g*8+i] = Alphabet[v&31]
			v >>= 5
		}
	}
	return string(buf)
}

// Traceparent validates a W3C trace context traceparent header. It is valid
// only when, after trimming surrounding spaces and tabs, it is exactly
// "00-<trace-id>-<parent-id>-<flags>" where trace-id is 32 lowercase hex
// digits not all zero, parent-id is 16 lowercase hex digits not all zero and
// flags is 2 lowercase hex digits. It returns the normalized (trimmed) header
// and true, or "" and false.
func Traceparent(header string) (string, bool) {
	s := strings.Trim(header, " \t")
	if len(s) != TraceparentLen {
		return "", false
	}
	if s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return "", false
	}
	if !lowerHex(s[3:35]) || allZero(s[3:35]) {
		return "", false
	}
	if !lowerHex(s[36:52]) || allZero(s[36:52]) {
		return "", false
	}
	if !lowerHex(s[53:55]) {
		return "", false
	}
	return s, true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}

// FromHeader builds the Meta of an incoming request from its headers: the
// X-Request-Id rule of [RequestID] and the traceparent rule of
// [Traceparent] (an invalid traceparent is dropped). When a header is
// repeated, only its first value is considered.
func FromHeader(h http.Header) Meta {
	tp, _ := Traceparent(h.Get(HeaderTraceparent))
	return Meta{
		RequestID:   RequestID(h.Get(HeaderRequestID)),
		Traceparent: tp,
	}
}

// Begin starts a request: it reads its metadata, answers its request id in
// the X-Request-Id response header and returns the context carrying both.
func Begin(w http.ResponseWriter, r *http.Request) (context.Context, Meta) {
	m := FromHeader(r.Header)
	w.Header().Set(HeaderRequestID, m.RequestID)
	return WithRequest(r.Context(), m), m
}

type ctxKey struct{}

// WithRequest returns a copy of ctx carrying m.
func WithRequest(ctx context.Context, m Meta) context.Context {
	return context.WithValue(ctx, ctxKey{}, m)
}

// FromContext returns the Meta stored by [WithRequest], or the zero Meta
// when ctx carries none.
func FromContext(ctx context.Context) Meta {
	if ctx == nil {
		return Meta{}
	}
	m, _ := ctx.Value(ctxKey{}).(Meta)
	return m
}
