package cursor

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const secret = "0123456789abcdef0123456789abcdef-test"

func TestRoundTripAndBinding(t *testing.T) {
	t.Parallel()
	s := New(secret)
	c := s.Seal("sites.list", "acme", []byte("site_01jd"))
	assert.Regexp(t, regexp.MustCompile(`^[A-Za-z0-9._:-]{1,256}$`), c, "fits the sites.list cursor pattern")
	pos, err := s.Open("sites.list", "acme", c)
	require.NoError(t, err)
	assert.Equal(t, "site_01jd", string(pos))

	for name, open := range map[string]func() ([]byte, error){
		"other method": func() ([]byte, error) { return s.Open("usage.list", "acme", c) },
		"other tenant": func() ([]byte, error) { return s.Open("sites.list", "globex", c) },
		"other secret": func() ([]byte, error) { return New(secret+"x").Open("sites.list", "acme", c) },
		"tampered":     func() ([]byte, error) { return s.Open("sites.list", "acme", "A"+c[1:]) },
		"garbage":      func() ([]byte, error) { return s.Open("sites.list", "acme", "not-a-cursor") },
		"empty":        func() ([]byte, error) { return s.Open("sites.list", "acme", "") },
	} {
		_, err := open()
		assert.ErrorIs(t, err, ErrInvalid, name)
	}
}

// TestEveryChangeIsRefused: a cursor with any one character changed, or cut
// short, or lengthened, does not open, the last character included (its
// unused low bits once let a changed cursor decode to the same bytes).
func TestEveryChangeIsRefused(t *testing.T) {
	t.Parallel()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	s := New(secret)
	for _, pos := range []string{"", "s", "si", "site_01jd"} { // every length mod 3
		c := s.Seal("sites.list", "acme", []byte(pos))
		for i := range len(c) {
			for _, r := range alphabet {
				if byte(r) == c[i] {
					continue
				}
				changed := c[:i] + string(r) + c[i+1:]
				_, err := s.Open("sites.list", "acme", changed)
				require.ErrorIs(t, err, ErrInvalid, "%q with character %d changed to %q", c, i, r)
			}
			_, err := s.Open("sites.list", "acme", c[:i])
			require.ErrorIs(t, err, ErrInvalid, "%q cut to %d characters", c, i)
		}
		for _, extra := range []string{"A", "=", "==", " ", "\n"} {
			_, err := s.Open("sites.list", "acme", c+extra)
			require.ErrorIs(t, err, ErrInvalid, "%q with %q appended", c, extra)
		}
	}
}

func FuzzOpen(f *testing.F) {
	s := New(secret)
	f.Add(s.Seal("m", "t", []byte("x")))
	f.Add("AAAA")
	f.Fuzz(func(t *testing.T, c string) {
		// Only the exact cursor Seal made opens: no other spelling of it.
		if pos, err := s.Open("m", "t", c); err == nil && s.Seal("m", "t", pos) != c {
			t.Fatalf("%q opened but is not the cursor of its position", c)
		}
	})
}
