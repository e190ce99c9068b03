package wire_test

import (
	"math/rand/v2"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/wire"
)

// catalogPatterns are the patterns gen/api and the packages below compile
// with MustPattern, read from their source so that a pattern added there is
// tested without a list to keep.
func catalogPatterns(t testing.TB) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	for _, file := range []string{"../../gen/api/rules_gen.go", "../config/load.go", "../providers/config.go", "../iam/embedded/service.go"} {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile("MustPattern\\((\"(?:[^\"\\\\]|\\\\.)*\"|`[^`]*`)\\)").FindAllStringSubmatch(string(src), -1) {
			p, err := strconv.Unquote(m[1])
			require.NoError(t, err)
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

// Patterns that exercise every branch of the shape compiler, beside the
// catalog's own.
var trickyPatterns = []string{
	`^[a-z0-9]([a-z0-9./-]{0,61}[a-z0-9])?$`,
	`^(inst|sbx)_[0-9a-hjkmnp-tv-z]{26,52}$`,
	`^/[^\x00]{0,254}$`,
	`^/[^\x00]+$`,
	`^a?b*c+d{2}e{1,}$`,
	`^x.y$`,
	`^(?s:x.y)$`,
	`^()ab$`,
	`^(a|bc|)$`,
	`^[é-ü]{1,3}z$`,
	`^(?i)abc$`,         // case folding: a regexp
	`^a{1,3}b{1,3}$`,    // two counts that vary, delimited: greedy
	`^a{1,3}[ab]{1,3}$`, // two counts that vary, not delimited: a regexp
	`^a+b?c+$`,          // an optional element after a varying one: a regexp
	`^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}(#[A-Za-z0-9._-]{1,64})?$`,
	`^(tenants/[A-Za-z0-9._:-]{1,128}|fleet)/[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`,
	`^[é-ü]{1,3}[a-z]+[^a-zé-ü]{2,}$`,
	`^(ab)+$`,                        // a repeated group: a regexp
	`abc`,                            // unanchored: a regexp
	`^a|b$`,                          // anchors inside the alternatives: a regexp
	`^(ab|cd)(ef|gh)(ij|kl)(mn|op)$`, // 16 alternatives: a regexp
}

func TestCatalogPatternsAreShapes(t *testing.T) {
	for _, p := range catalogPatterns(t) {
		_, isRegexp := wire.MustPattern(p).(*regexp.Regexp)
		// The one catalog pattern with a repeated group stays a regexp.
		want := strings.Contains(p, ")*") || strings.Contains(p, ")+")
		assert.Equal(t, want, isRegexp, "pattern %s", p)
	}
	for p, want := range map[string]bool{
		`^(?i)abc$`: true, `^a{1,3}b{1,3}$`: false, `^a{1,3}[ab]{1,3}$`: true, `^a+b?c+$`: true, `^(ab)+$`: true, `abc`: true,
		`^a|b$`: true, `^(ab|cd)(ef|gh)(ij|kl)(mn|op)$`: true, `^(a|b)(c|d)$`: false, `^(a|bc|)$`: false, `^/[^\x00]+$`: false,
	} {
		_, isRegexp := wire.MustPattern(p).(*regexp.Regexp)
		assert.Equal(t, want, isRegexp, "pattern %s", p)
	}
}

func TestPatternStringIsItsSource(t *testing.T) {
	for _, p := range append(catalogPatterns(t), trickyPatterns...) {
		assert.Equal(t, p, wire.MustPattern(p).String())
	}
}

func TestPatternRejectsBadSyntax(t *testing.T) {
	_, err := wire.CompilePattern(`^[a-z$`)
	_, want := regexp.Compile(`^[a-z$`)
	require.Equal(t, want, err)
	assert.Panics(t, func() { wire.MustPattern(`(`) })
}

// candidates are strings around each pattern's bounds: every length from 0
// to 300 built from characters the pattern's own source names, with one
// character swapped for another of them or for one outside, and a few
// non-ASCII and invalid UTF-8 strings.
func candidates(p string, rng *rand.Rand) []string {
	alphabet := []rune("az09AZ_-.:/@~+=é\x00\xff")
	for _, r := range p {
		alphabet = append(alphabet, r)
	}
	var out []string
	for n := range 300 {
		for range 3 {
			b := make([]rune, n)
			for i := range b {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			}
			out = append(out, string(b))
		}
	}
	out = append(out, "", "\xff", "a\xffb", "/\xff", "/é", "site_"+strings.Repeat("0", 26), "site_"+strings.Repeat("0", 53))
	return out
}

func TestPatternsAgreeWithRegexp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range append(catalogPatterns(t), trickyPatterns...) {
		re := regexp.MustCompile(p)
		got := wire.MustPattern(p)
		matched := 0
		for _, s := range append(candidates(p, rng), matchingSamples(p)...) {
			want := re.MatchString(s)
			require.Equal(t, want, got.MatchString(s), "pattern %s on %q", p, s)
			if want {
				matched++
			}
		}
		assert.Positive(t, matched, "pattern %s: no candidate matched, so the test shows nothing", p)
	}
}

// matchingSamples are strings the catalog's patterns accept at their
// bounds, built by hand from the pattern's classes.
func matchingSamples(p string) []string {
	ids := strings.Repeat("0", 26)
	out := []string{"a", "a1", "A", "AB_9", "/a", "/x/y", "*", "a.b", "a.*", "ab", "abccdd", "xzy", "ézz", "é", "cd", "bc", "a" + ids,
		"acdde", "bbcddee", "éz", "ééüz", "ABC", "aBc", "abefijmn", "cdghklop",
		"aaa", "aab", "abbb", "aaab", "ac", "abc", "aaccc", "ab/c.d#x", "a#b", "tenants/t1/x", "fleet/x", "tenants//x", "fleet/", "éaz!!", "üüüzz..", "é1",
		"compute:sites:get", "compute:a:b-1", "0123456789abcdef", "0123456789abcdeu"}
	if i := strings.Index(p, "_["); i > 0 && strings.HasPrefix(p, "^") {
		prefix := strings.Trim(p[1:i+1], "()")
		for _, alt := range strings.Split(prefix, "|") {
			alt = strings.TrimSuffix(alt, ")_") + "_"
			alt = strings.ReplaceAll(alt, "__", "_")
			out = append(out, alt+ids, alt+strings.Repeat("z", 52), alt+strings.Repeat("z", 53), alt+strings.Repeat("z", 25))
		}
	}
	for _, n := range []int{31, 32, 33, 62, 63, 64, 127, 128, 129, 199, 200, 254, 255, 256, 257} {
		out = append(out, strings.Repeat("a", n), "/"+strings.Repeat("a", n), "A"+strings.Repeat("A", n))
	}
	return out
}

// FuzzPatternAgreesWithRegexp: the compact matcher answers as regexp does
// for each catalog pattern and each tricky one, on any string.
func FuzzPatternAgreesWithRegexp(f *testing.F) {
	patterns := append(catalogPatterns(f), trickyPatterns...)
	for i, p := range patterns {
		f.Add(uint8(i), "a")
		f.Add(uint8(i), p)
	}
	f.Add(uint8(0), "\xff\xfe")
	res := make([]*regexp.Regexp, len(patterns))
	ours := make([]wire.Pattern, len(patterns))
	for i, p := range patterns {
		res[i], ours[i] = regexp.MustCompile(p), wire.MustPattern(p)
	}
	f.Fuzz(func(t *testing.T, i uint8, s string) {
		k := int(i) % len(patterns)
		if res[k].MatchString(s) != ours[k].MatchString(s) {
			t.Fatalf("pattern %s on %q: regexp %v, ours %v", patterns[k], s, res[k].MatchString(s), ours[k].MatchString(s))
		}
	})
}

// The catalog's patterns as shapes hold a small fraction of the heap the
// same patterns take as regexps: the heap the api process's collector
// marks on every cycle.
func TestCatalogPatternsHoldLittleHeap(t *testing.T) {
	patterns := catalogPatterns(t)
	asRegexp := retained(func() any {
		out := make([]*regexp.Regexp, len(patterns))
		for i, p := range patterns {
			out[i] = regexp.MustCompile(p)
		}
		return out
	})
	asPattern := retained(func() any {
		out := make([]wire.Pattern, len(patterns))
		for i, p := range patterns {
			out[i] = wire.MustPattern(p)
		}
		return out
	})
	t.Logf("%d patterns: %d bytes as regexps, %d as compiled here", len(patterns), asRegexp, asPattern)
	assert.Less(t, asPattern*10, asRegexp, "the compact matchers should hold under a tenth of the regexps' heap")
}

// retained is the heap build's result keeps alive.
func retained(build func() any) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

func BenchmarkPatternMatch(b *testing.B) {
	const p, s = "^site_[0-9a-hjkmnp-tv-z]{26,52}$", "site_01hzy3k5v6w7x8y9z0abcdefgh"
	b.Run("regexp", func(b *testing.B) {
		re := regexp.MustCompile(p)
		b.ReportAllocs()
		for b.Loop() {
			re.MatchString(s)
		}
	})
	b.Run("shape", func(b *testing.B) {
		sh := wire.MustPattern(p)
		b.ReportAllocs()
		for b.Loop() {
			sh.MatchString(s)
		}
	})
}
