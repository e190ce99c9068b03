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

func FuzzOpen(f *testing.F) {
	s := New(secret)
	f.Add(s.Seal("m", "t", []byte("x")))
	f.Add("AAAA")
	f.Fuzz(func(t *testing.T, c string) {
		pos, err := s.Open("m", "t", c)
		if err == nil && s.Seal("m", "t", pos) != c {
			// Only canonical encodings of sealed positions open.
			if _, err2 := s.Open("m", "t", s.Seal("m", "t", pos)); err2 != nil {
				t.Fatal("a re-sealed position does not open")
			}
		}
	})
}
