package workers

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/db"
)

// NumShards is the number of shard leases (interface specification, Limits:
// Shards).
const NumShards = 256

// ErrLeaseLost is returned by Lease.Fence, possibly wrapped, when the lease
// has another holder or epoch, or has expired: the caller must not write.
// It is also the cause (context.Cause) of the context of work whose lease
// was lost.
var ErrLeaseLost = errors.New("workers: lease lost")

// Lease is one grant of a lease: its name, the worker holding it and the
// epoch of this grant. Every acquisition raises the epoch, so a Lease value
// names one grant and no later one.
type Lease struct {
	Name   string // shard/<n> or job/<name>
	Holder string // the worker id
	Epoch  int64
}

// Fence checks, inside the caller's transaction, that the lease is still
// this grant and unexpired, and locks its row (FOR SHARE) so that no other
// worker can take it over until the transaction ends. Call it in every
// transaction that writes under the lease, before committing; it returns
// ErrLeaseLost when the grant is gone, and the caller must then roll back.
func (l Lease) Fence(ctx context.Context, tx pgx.Tx) error {
	_, err := db.New(tx).FenceLease(ctx, db.FenceLeaseParams{Name: l.Name, Holder: l.Holder, Epoch: l.Epoch})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s epoch %d of %s", ErrLeaseLost, l.Name, l.Epoch, l.Holder)
	}
	if err != nil {
		return fmt.Errorf("workers: fence %s: %w", l.Name, err)
	}
	return nil
}

// ShardOf returns the shard (0 to NumShards-1) that key belongs to: the
// first byte of SHA-256 of the key. It is stable across processes and
// releases.
func ShardOf(key string) int {
	sum := sha256.Sum256([]byte(key))
	return int(sum[0]) % NumShards
}

// ShardLease names the lease of shard s.
func ShardLease(s int) string { return "shard/" + strconv.Itoa(s) }

// JobLease names the lease of the singleton job name.
func JobLease(name string) string { return "job/" + name }

// weight is the rendezvous (highest random weight) score of a worker for a
// lease: the lease goes to the candidate with the highest weight, so each
// worker joining or leaving moves only the leases it wins or held.
func weight(worker, lease string) uint64 {
	h := sha256.New()
	h.Write([]byte(worker))
	h.Write([]byte{0})
	h.Write([]byte(lease))
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// owner returns the candidate with the highest weight for lease; ties (only
// for equal ids) go to the smaller id. Empty when there is no candidate.
func owner(lease string, candidates []string) string {
	var best string
	var bestW uint64
	for _, c := range candidates {
		w := weight(c, lease)
		if best == "" || w > bestW || (w == bestW && c < best) {
			best, bestW = c, w
		}
	}
	return best
}
