package gateway

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
