package gateway

import (
	"crypto/tls"
	"time"
)

// TicketKeyPeriod is how long one session ticket key seals new tickets. A
// key opens tickets for gateway.sessionTicketDays periods, so a ticket
// resumes for sessionTicketDays-1 to sessionTicketDays days after it was
// issued, never past its client certificate's expiry (crypto/tls checks
// it) and never for a revoked node (VerifyConnection runs on resumption
// too).
const TicketKeyPeriod = 24 * time.Hour

// setTicketKeys gives tc no tickets when gateway.sessionTicketDays is 0,
// otherwise the session ticket keys of the current period
// (sealing) and of the periods before it (opening only). Every gateway of the
// deployment derives the same keys from the PKI bundle
// (pki.Bundle.SessionTicketKey), so a daemon resumes its TLS session on a
// restarted gateway, or on another one, without a full handshake: no
// certificate signature made or checked but the chain's, and the hybrid
// key exchange still runs (TLS 1.3 resumption with psk_dhe_ke). It is
// called at start and every lease renewal; crypto/tls allows replacing
// the keys while it serves.
func (g *Gateway) setTicketKeys(tc *tls.Config) error {
	days := g.o.Config.SessionTicketDays
	if days == 0 {
		return nil // tlsConfig disabled tickets
	}
	period := g.o.Now().Unix() / int64(TicketKeyPeriod/time.Second)
	if g.ticketPeriod.Load() == period {
		return nil
	}
	keys := make([][32]byte, days)
	for i := range keys {
		k, err := g.bundle.SessionTicketKey(period - int64(i))
		if err != nil {
			return err
		}
		keys[i] = k
	}
	tc.SetSessionTicketKeys(keys) // the first seals
	g.ticketPeriod.Store(period)
	return nil
}
