// Package cursor seals list positions into opaque cursors: base64url of the
// position and an HMAC-SHA256 tag keyed from the service secret and bound to
// the method and the tenant. A cursor another method, another tenant or
// anyone else made does not open.
package cursor

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"

	"computeplane/internal/keys"
)

// tagLen is the length of the truncated tag: 128 bits.
const tagLen = 16

// ErrInvalid is the answer to a cursor the method did not return.
var ErrInvalid = errors.New("cursor: not a cursor this method returned")

// Sealer seals and opens cursors.
type Sealer struct{ key []byte }

// New returns a sealer keyed from the service secret.
func New(secret string) *Sealer { return &Sealer{key: keys.Derive(secret, keys.Cursors)} }

func (s *Sealer) tag(method, tenant string, pos []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, p := range [][]byte{[]byte(method), []byte(tenant), pos} {
		var n [4]byte
		n[0], n[1], n[2], n[3] = byte(len(p)>>24), byte(len(p)>>16), byte(len(p)>>8), byte(len(p))
		m.Write(n[:])
		m.Write(p)
	}
	return m.Sum(nil)[:tagLen]
}

// Seal returns the cursor of pos for method and tenant.
func (s *Sealer) Seal(method, tenant string, pos []byte) string {
	buf := append(append([]byte{}, pos...), s.tag(method, tenant, pos)...)
	return encoding.EncodeToString(buf)
}

// encoding is strict: a last character whose unused low bits are set
// decodes to the same bytes as the canonical one, and would make a changed
// cursor open. The decoder also skips CR and LF, so Open compares the
// cursor with the canonical spelling of what it decoded.
var encoding = base64.RawURLEncoding.Strict()

// Open returns the position inside a cursor, or ErrInvalid.
func (s *Sealer) Open(method, tenant, c string) ([]byte, error) {
	buf, err := encoding.DecodeString(c)
	if err != nil || len(buf) < tagLen || encoding.EncodeToString(buf) != c {
		return nil, ErrInvalid
	}
	pos, tag := buf[:len(buf)-tagLen], buf[len(buf)-tagLen:]
	if !hmac.Equal(tag, s.tag(method, tenant, pos)) {
		return nil, ErrInvalid
	}
	return pos, nil
}
