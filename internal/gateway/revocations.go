package gateway

import (
	"context"
	"sync/atomic"

	"computeplane/gen/db"
)

// Revocation kinds.
const (
	RevokeNode   = "node"
	RevokeSerial = "serial"
)

// TopicRevocations wakes gateways after a revocation was written, so that
// they close the revoked sessions at once instead of at their next poll.
const TopicRevocations = "gateway-revocations"

// revocationSet is the node ids and certificate serials gateways refuse,
// replaced whole on every load.
type revocationSet struct {
	p atomic.Pointer[map[string]bool]
}

func revocationKey(kind, value string) string { return kind + "/" + value }

func (s *revocationSet) load(ctx context.Context, q *db.Queries) error {
	rows, err := q.ListRevocations(ctx)
	if err != nil {
		return err
	}
	m := make(map[string]bool, len(rows))
	for _, r := range rows {
		m[revocationKey(r.Kind, r.Value)] = true
	}
	s.p.Store(&m)
	return nil
}

func (s *revocationSet) revoked(node, serial string) bool {
	m := s.p.Load()
	if m == nil {
		return false
	}
	return (*m)[revocationKey(RevokeNode, node)] || (*m)[revocationKey(RevokeSerial, serial)]
}
