package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
)

// TicketCacheSize is how many gateways' session tickets a daemon keeps
// (one per server name, the last ticket each).
const TicketCacheSize = 16

// ticketCache holds the daemon's TLS session tickets; reset replaces them
// all, after a renewal: a resumed session carries the certificate of the
// handshake that issued its ticket, and the gateway records the serial of
// the certificate a session presents.
type ticketCache struct {
	mu sync.Mutex
	c  tls.ClientSessionCache
}

func (t *ticketCache) get() tls.ClientSessionCache {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.c == nil {
		t.c = tls.NewLRUClientSessionCache(TicketCacheSize)
	}
	return t.c
}

func (t *ticketCache) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.c = nil
}

// KeepTicket puts back the session ticket (saved, cached under key before
// the dial) that a failed dial made crypto/tls drop, when the dial failed
// on the transport: the connection reset, closed or timed out, as happens
// to the handshakes a gateway has accepted in the moment it goes down.
// crypto/tls drops the ticket of any failed resumption (RFC 5077's
// advice, to recover from a ticket the server cannot take, which it
// signals with an alert), so without this every daemon that dialled its
// restarting gateway just then came back with a full handshake. A
// gateway's alert, or the daemon's own check of the gateway's
// certificate, still drops it; so does a ticket replaced meanwhile.
// tools/sessionload's own dial calls it as the daemon's does.
func KeepTicket(cache tls.ClientSessionCache, key string, saved *tls.ClientSessionState, err error) {
	if saved == nil || !transportFailure(err) {
		return
	}
	if cur, ok := cache.Get(key); ok && cur != nil {
		return
	}
	cache.Put(key, saved)
}

// transportFailure says whether err is the connection's failing rather
// than either side's refusal: a TLS alert from the gateway is a
// *net.OpError of Op "remote error" wrapping none of these.
func transportFailure(err error) bool {
	for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
