// Package ids makes the service's identifiers: a prefix, an underscore and
// 26 lowercase Crockford base32 characters, either time-ordered random
// (New, a lowercased ULID) or derived from the parts of an idempotent
// request (Derive), as ARCHITECTURE.md decides.
package ids

import (
	"crypto/sha256"
	"encoding/binary"

	"computeplane/internal/reqmeta"
)

// BodyLen is the number of characters after the prefix and underscore.
const BodyLen = reqmeta.IDBodyLen

// New returns a new time-ordered random id such as site_01jd....
func New(prefix string) string { return reqmeta.NewID(prefix) }

// Derive returns the id an idempotent create makes from its parts (tenant,
// calling identity, idempotency key): the first 130 bits of SHA-256 over
// the length-prefixed parts, so a retry lands on the same id and no two
// different part lists collide by concatenation.
func Derive(prefix string, parts ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	sum := h.Sum(nil)
	out := make([]byte, 0, len(prefix)+1+BodyLen)
	out = append(out, prefix...)
	out = append(out, '_')
	// 26 characters of 5 bits each: 130 bits read from the digest's start.
	var acc uint64
	bits := 0
	i := 0
	for len(out) < len(prefix)+1+BodyLen {
		if bits < 5 {
			acc = acc<<8 | uint64(sum[i])
			i++
			bits += 8
		}
		bits -= 5
		out = append(out, reqmeta.Alphabet[(acc>>uint(bits))&31])
	}
	return string(out)
}
