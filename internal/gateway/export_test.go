package gateway

import "context"

// BatchHellos turns the hellos' batch statement on or off (on by default);
// off, every hello takes openRow's transaction, as before the batches.
func BatchHellos(on bool) { batchHellos.Store(on) }

// CertFrom signs a client certificate for key with ca, naming uri, valid
// in [from, until) (chaincache_test.go's nodeCert).
var CertFrom = nodeCert

// KeptGoroutines is how many goroutines the gateway keeps for handshakes
// and bursts (bursts.go): bounded, not a session's.
func (g *Gateway) KeptGoroutines() int {
	return int(g.handshakes.workers.Load() + g.bursts.workers.Load())
}

// SetHandshakeLimit sets the bound on handshakes computing at once of the
// gateways made next (0: HandshakesPerCore per core).
func SetHandshakeLimit(n int) { handshakeLimit = n }

// HandshakePeak is the most handshakes that computed at once.
func (g *Gateway) HandshakePeak() int {
	g.turns.mu.Lock()
	defer g.turns.mu.Unlock()
	return g.turns.peak
}

// Touch runs the renewal's touch of the sessions' rows now.
func (g *Gateway) Touch(ctx context.Context) { g.touch(ctx) }
