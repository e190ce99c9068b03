package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math"
	"sync/atomic"
	"time"

	"computeplane/internal/pki"
)

// TicketKeyPeriod is how long one session ticket key seals new tickets. A
// key opens tickets for gateway.sessionTicketDays periods, so a ticket
// resumes for sessionTicketDays-1 to sessionTicketDays days after it was
// issued, never past its client certificate's expiry and never for a
// revoked node (VerifyConnection runs on resumption too).
const TicketKeyPeriod = 24 * time.Hour

// rootSet is the node CA roots client chains verify against, as read.
type rootSet struct {
	pool *x509.CertPool
	// digest names the set (pki.RootsDigest): the session ticket keys
	// are bound to it.
	digest [32]byte
	// from and until bound the time every root is valid in: a resumed
	// session skips the chain verification only then (resumedChain).
	from, until time.Time
}

func newRootSet(certs []*x509.Certificate) *rootSet {
	rs := &rootSet{pool: x509.NewCertPool(), digest: pki.RootsDigest(certs)}
	for i, c := range certs {
		rs.pool.AddCert(c)
		if i == 0 || c.NotBefore.After(rs.from) {
			rs.from = c.NotBefore
		}
		if i == 0 || c.NotAfter.Before(rs.until) {
			rs.until = c.NotAfter
		}
	}
	return rs
}

// trust is what a handshake checks a client with: the node CA roots and
// the tls.Config the handshake runs on, whose VerifyConnection verifies
// against these roots and whose session ticket keys are bound to them.
// So a ticket one of its handshakes seals carries a chain that verified
// against these roots (crypto/tls seals it after VerifyConnection and the
// client's CertificateVerify, or after a resumption, with the certificates
// of a ticket sealed the same way), and a ticket sealed under other roots
// does not open: the daemon falls back to a full handshake, verified.
type trust struct {
	roots  *rootSet
	tc     *tls.Config
	period atomic.Int64 // of tc's ticket keys
}

// currentTrust is the trust of the roots read last (the file is read
// again every ReloadEvery): roots that changed get a trust of their own,
// with the ticket keys bound to them, which new handshakes take
// (tlsConfig's GetConfigForClient); handshakes under way finish on the
// one they started with.
func (g *Gateway) currentTrust() *trust {
	rs := g.roots.get()
	t := g.trust.Load()
	if t != nil && (t.roots == rs || t.roots.digest == rs.digest) {
		return t
	}
	g.trustMu.Lock()
	defer g.trustMu.Unlock()
	if t = g.trust.Load(); t != nil && t.roots.digest == rs.digest {
		return t
	}
	nt := &trust{roots: rs}
	nt.period.Store(math.MinInt64)
	nt.tc = g.handshakeConfig(nt)
	if err := g.setTicketKeys(nt); err != nil {
		// Without keys bound to these roots, no tickets at all.
		g.o.Log.Warn("gateway: session ticket keys; no session tickets", "error", err.Error())
		nt.tc.SessionTicketsDisabled = true
	}
	if t != nil {
		g.o.Log.Info("gateway: the node CA roots changed; new session ticket keys, tickets sealed before do not resume")
	}
	g.trust.Store(nt)
	return nt
}

// rotateTicketKeys moves the current trust's keys to the current period
// (every lease renewal).
func (g *Gateway) rotateTicketKeys() error {
	return g.setTicketKeys(g.currentTrust())
}

// setTicketKeys gives t's config no tickets when gateway.sessionTicketDays
// is 0, otherwise the session ticket keys of the current period
// (sealing) and of the periods before it (opening only), bound to t's
// roots. Every gateway of the deployment with the same roots derives the
// same keys from the PKI bundle (pki.Bundle.SessionTicketKey), so a
// daemon resumes its TLS session on a restarted gateway, or on another
// one, without a full handshake: no certificate signature made or
// checked, and the hybrid key exchange still runs (TLS 1.3 resumption
// with psk_dhe_ke). crypto/tls allows replacing the keys while it serves.
func (g *Gateway) setTicketKeys(t *trust) error {
	days := g.o.Config.SessionTicketDays
	if days == 0 {
		return nil // handshakeConfig disabled tickets
	}
	period := g.o.Now().Unix() / int64(TicketKeyPeriod/time.Second)
	if t.period.Load() == period {
		return nil
	}
	keys := make([][32]byte, days)
	for i := range keys {
		k, err := g.bundle.SessionTicketKey(period-int64(i), t.roots.digest)
		if err != nil {
			return err
		}
		keys[i] = k
	}
	t.tc.SetSessionTicketKeys(keys) // the first seals
	t.period.Store(period)
	return nil
}

// resumedChain checks the certificates a resumed session's ticket
// carried, in place of x509's Verify: their chain verified against t's
// roots when the ticket (or the one it was resumed from) was sealed,
// since only a handshake verifying against these roots holds a key that
// opens it. What may have changed since is checked: every certificate's
// validity at now (a ticket outlives a certificate) and the roots' own.
// The trust domain, the node id and the revocation set are the caller's,
// as on every handshake. ok false: the roots are not all valid at now,
// verify the chain.
func resumedChain(t *trust, certs []*x509.Certificate, now time.Time) (ok bool, err error) {
	if now.Before(t.roots.from) || now.After(t.roots.until) {
		return false, nil
	}
	for _, c := range certs {
		if now.Before(c.NotBefore) || now.After(c.NotAfter) {
			return true, errors.New("a certificate of the resumed session is outside its validity")
		}
	}
	return true, nil
}
