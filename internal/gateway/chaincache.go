package gateway

import (
	"crypto/sha256"
	"crypto/x509"
	"sync"
	"time"
)

// After a gateway restart every daemon comes back at once, each with the
// client certificate it presented before: verifying its chain again (the
// node CA's signature over the leaf, checked with ECDSA, and the chain
// building around it) was a few percent of the restarted gateway's CPU
// per session. chainCache remembers the chains that verified: the exact
// certificates (a SHA-256 over their DER), the roots they verified
// against and the earliest NotAfter of the chain. A hit skips only
// x509's Verify, which depends on nothing else (the certificates' bytes,
// the roots and the time, and the time only through the validity
// periods); the rest of the checks run on every handshake: the client's
// CertificateVerify signature (crypto/tls, the proof it holds the key),
// the trust domain and node id, and the revocation set.

// chainCacheSize bounds the verified chains remembered: above it, an
// arbitrary entry goes. An entry is 40 bytes (key and expiry), about 75
// with the map's own.
const chainCacheSize = 1 << 15

type chainKey [sha256.Size]byte

type chainEntry struct {
	notAfter int64 // UnixNano: the entry is good before it
}

type chainCache struct {
	mu    sync.Mutex
	roots *x509.CertPool // the roots the entries verified against
	m     map[chainKey]chainEntry
	max   int
}

func newChainCache(max int) *chainCache {
	return &chainCache{m: map[chainKey]chainEntry{}, max: max}
}

func chainKeyOf(certs []*x509.Certificate) chainKey {
	h := sha256.New()
	var n [4]byte
	for _, c := range certs {
		// Length-prefixed, so that two chains cannot hash alike by moving
		// bytes between certificates.
		l := len(c.Raw)
		n[0], n[1], n[2], n[3] = byte(l>>24), byte(l>>16), byte(l>>8), byte(l)
		h.Write(n[:])
		h.Write(c.Raw)
	}
	var k chainKey
	h.Sum(k[:0])
	return k
}

// verified says whether certs verified against roots before and are all
// still within their validity at now. Roots other than the entries' (a
// re-read node CA file that changed) empty the cache.
func (c *chainCache) verified(k chainKey, roots *x509.CertPool, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.sameRoots(roots) {
		return false
	}
	e, ok := c.m[k]
	if !ok {
		return false
	}
	if now.UnixNano() >= e.notAfter {
		delete(c.m, k)
		return false
	}
	return true
}

// add remembers a chain that verified against roots at now; chain is
// the verified chain (leaf to root) whose earliest NotAfter bounds the
// entry, and so does each of until (a resumed chain's roots' validity).
func (c *chainCache) add(k chainKey, roots *x509.CertPool, chain []*x509.Certificate, now time.Time, until ...time.Time) {
	notAfter := int64(1<<63 - 1)
	for _, u := range until {
		notAfter = min(notAfter, u.UnixNano())
	}
	for _, x := range chain {
		notAfter = min(notAfter, x.NotAfter.UnixNano())
	}
	if now.UnixNano() >= notAfter {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sameRoots(roots)
	if len(c.m) >= c.max {
		for old := range c.m {
			delete(c.m, old)
			break
		}
	}
	c.m[k] = chainEntry{notAfter: notAfter}
}

// sameRoots keeps the entries when roots are the entries' roots (the
// same pool, or a pool read again with the same certificates) and drops
// them otherwise. Called with mu held.
func (c *chainCache) sameRoots(roots *x509.CertPool) bool {
	switch {
	case c.roots == roots:
		return true
	case c.roots != nil && c.roots.Equal(roots):
		c.roots = roots
		return true
	}
	clear(c.m)
	c.roots = roots
	return false
}

func (c *chainCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
