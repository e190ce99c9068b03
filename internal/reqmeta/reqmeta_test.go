package reqmeta

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	reCallerID    = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	reGeneratedID = regexp.MustCompile(`^req_[0-9a-hjkmnp-tv-z]{26}$`)
	reTraceparent = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
)

func TestRequestID(t *testing.T) {
	cases := []struct {
		name   string
		header string
		keep   bool
	}{
		{"simple", "abc", true},
		{"one char", "a", true},
		{"all allowed chars", "AZaz09._:-", true},
		{"uuid", "0f8fad5b-d9cb-469f-a165-70867728950e", true},
		{"max length", strings.Repeat("x", 128), true},
		{"empty", "", false},
		{"too long", strings.Repeat("x", 129), false},
		{"space", "a b", false},
		{"slash", "a/b", false},
		{"plus", "a+b", false},
		{"newline", "abc\n", false},
		{"unicode", "héllo", false},
		{"nul", "a\x00b", false},
		{"invalid utf8", "a\xffb", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := RequestID(tc.header)
			if tc.keep {
				assert.Equal(t, tc.header, got)
				assert.True(t, ValidRequestID(tc.header))
			} else {
				assert.False(t, ValidRequestID(tc.header))
				assert.Regexp(t, reGeneratedID, got)
			}
		})
	}
}

func TestRequestIDGeneratedUnique(t *testing.T) {
	seen := make(map[string]bool)
	for range 1000 {
		id := RequestID("")
		require.Regexp(t, reGeneratedID, id)
		require.False(t, seen[id], "duplicate id %s", id)
		seen[id] = true
	}
}

func TestNewID(t *testing.T) {
	for _, prefix := range []string{"site", "pool", "sbxt", "vol", "pacct", "prj", "whk", "dlv"} {
		id := NewID(prefix)
		assert.Regexp(t, `^`+prefix+`_[0-9a-hjkmnp-tv-z]{26}$`, id)
	}
	// A generated site id matches the specification's SiteId shape.
	id := NewID("site")
	assert.Regexp(t, `^site_[0-9a-hjkmnp-tv-z]{26,52}$`, id)
	assert.LessOrEqual(t, len(id), 64)
	assert.Regexp(t, `^_[0-9a-hjkmnp-tv-z]{26}$`, NewID(""))
}

func decodeTime(t *testing.T, body string) uint64 {
	t.Helper()
	var ms uint64
	for i := 0; i < 10; i++ {
		idx := strings.IndexByte(Alphabet, body[i])
		require.GreaterOrEqual(t, idx, 0)
		ms = ms<<5 | uint64(idx)
	}
	return ms
}

func TestNewIDTimeLayout(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_123)
	id := newIDAt("x", at)
	require.Len(t, id, 2+26)
	assert.Equal(t, uint64(1_700_000_000_123), decodeTime(t, id[2:]))

	// Known encoding: ms 0 is ten zeros; first char is at most '7' (48 bits
	// in 50).
	assert.Equal(t, "0000000000", newIDAt("x", time.UnixMilli(0))[2:12])
	maxID := newIDAt("x", time.UnixMilli(1<<48-1))
	assert.Equal(t, "7zzzzzzzzz", maxID[2:12])

	// Ids from later milliseconds sort after earlier ones.
	a := newIDAt("x", at)
	b := newIDAt("x", at.Add(time.Millisecond))
	assert.Less(t, a, b)

	now := uint64(time.Now().UnixMilli())
	got := decodeTime(t, NewID("x")[2:])
	assert.InDelta(t, float64(now), float64(got), 5000)
}

func TestTraceparent(t *testing.T) {
	const (
		trace  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent = "00f067aa0ba902b7"
		valid  = "00-" + trace + "-" + parent + "-01"
	)
	cases := []struct {
		name   string
		header string
		want   string
		ok     bool
	}{
		{"valid sampled", valid, valid, true},
		{"valid not sampled", "00-" + trace + "-" + parent + "-00", "00-" + trace + "-" + parent + "-00", true},
		{"valid other flags", "00-" + trace + "-" + parent + "-ff", "00-" + trace + "-" + parent + "-ff", true},
		{"surrounding whitespace trimmed", " \t" + valid + " ", valid, true},
		{"empty", "", "", false},
		{"version 01", "01-" + trace + "-" + parent + "-01", "", false},
		{"version ff", "ff-" + trace + "-" + parent + "-01", "", false},
		{"zero trace id", "00-" + strings.Repeat("0", 32) + "-" + parent + "-01", "", false},
		{"zero parent id", "00-" + trace + "-" + strings.Repeat("0", 16) + "-01", "", false},
		{"uppercase trace id", "00-" + strings.ToUpper(trace) + "-" + parent + "-01", "", false},
		{"uppercase flags", "00-" + trace + "-" + parent + "-0A", "", false},
		{"non hex", "00-" + strings.Replace(trace, "4", "g", 1) + "-" + parent + "-01", "", false},
		{"short trace id", "00-" + trace[:31] + "-" + parent + "-01", "", false},
		{"short parent id", "00-" + trace + "-" + parent[:15] + "-01", "", false},
		{"one-char flags", "00-" + trace + "-" + parent + "-1", "", false},
		{"trailing data", valid + "-00", "", false},
		{"trailing junk", valid + "x", "", false},
		{"wrong separator", "00_" + trace + "-" + parent + "-01", "", false},
		{"missing separator", "00" + trace + "-" + parent + "-01x", "", false},
		{"inner space", "00-" + trace + " " + parent + "-01", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Traceparent(tc.header)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestContext(t *testing.T) {
	assert.Equal(t, Meta{}, FromContext(context.Background()))
	assert.Equal(t, Meta{}, FromContext(nil)) //nolint:staticcheck // a nil context must not panic

	m := Meta{RequestID: "abc", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	ctx := WithRequest(context.Background(), m)
	assert.Equal(t, m, FromContext(ctx))

	// Inner value wins; outer context unchanged.
	m2 := Meta{RequestID: "def"}
	ctx2 := WithRequest(ctx, m2)
	assert.Equal(t, m2, FromContext(ctx2))
	assert.Equal(t, m, FromContext(ctx))
}

func TestFromHeader(t *testing.T) {
	h := http.Header{}
	h.Set(HeaderRequestID, "client-123")
	h.Set(HeaderTraceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	m := FromHeader(h)
	assert.Equal(t, "client-123", m.RequestID)
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", m.Traceparent)

	h = http.Header{}
	h.Set(HeaderRequestID, "bad id")
	h.Set(HeaderTraceparent, "garbage")
	m = FromHeader(h)
	assert.Regexp(t, reGeneratedID, m.RequestID)
	assert.Empty(t, m.Traceparent)

	m = FromHeader(http.Header{})
	assert.Regexp(t, reGeneratedID, m.RequestID)
	assert.Empty(t, m.Traceparent)
}

func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "abc", "a b", strings.Repeat("x", 128), strings.Repeat("x", 129), "héllo", "\xff", "req_01hzy"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		got := RequestID(header)
		if reCallerID.MatchString(header) {
			if got != header {
				t.Fatalf("valid header %q replaced by %q", header, got)
			}
			return
		}
		if !reGeneratedID.MatchString(got) {
			t.Fatalf("invalid header %q gave malformed id %q", header, got)
		}
		if !reCallerID.MatchString(got) {
			t.Fatalf("generated id %q is not itself a valid request id", got)
		}
	})
}

func FuzzTraceparent(f *testing.F) {
	for _, s := range []string{
		"",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\t",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		got, ok := Traceparent(header)
		trimmed := strings.Trim(header, " \t")
		want := reTraceparent.MatchString(trimmed) &&
			trimmed[3:35] != strings.Repeat("0", 32) &&
			trimmed[36:52] != strings.Repeat("0", 16)
		if ok != want {
			t.Fatalf("Traceparent(%q) ok=%v, oracle %v", header, ok, want)
		}
		if !ok {
			if got != "" {
				t.Fatalf("Traceparent(%q) invalid but returned %q", header, got)
			}
			return
		}
		if got != trimmed || !reTraceparent.MatchString(got) {
			t.Fatalf("Traceparent(%q) returned malformed %q", header, got)
		}
		// Normalizing is idempotent.
		again, ok2 := Traceparent(got)
		if !ok2 || again != got {
			t.Fatalf("Traceparent not idempotent on %q", got)
		}
	})
}
