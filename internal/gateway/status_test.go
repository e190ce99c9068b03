package gateway

import (
	"encoding/json"
	"hash/fnv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

// A heartbeat that repeats the last status's frame is heard and skipped
// without being decoded: no allocation, the skip counted, the session
// seen.
func TestARepeatedStatusFrameIsSkippedUndecoded(t *testing.T) {
	st := &agentproto.Status{Instances: []agentproto.InstanceStatus{}, VolumeStore: agentproto.VolumeStore{AvailableBytes: 1}}
	frame, err := json.Marshal(agentproto.Message{Type: agentproto.TypeStatus, Status: st})
	require.NoError(t, err)
	canonical, err := json.Marshal(st)
	require.NoError(t, err)
	h := fnv.New64a()
	_, _ = h.Write(canonical)
	assert.Equal(t, h.Sum64(), fnv64a(canonical), "hash/fnv's FNV-1a: the rows' status_hash is unchanged")

	now := time.Unix(1_800_000_000, 0)
	s := &session{g: &Gateway{o: Options{Now: func() time.Time { return now }}}}
	// The node's row holds this status (its hash): the session's first
	// status is skipped as before, decoded.
	s.lastStatus, s.firstStatus = fnv64a(canonical), true
	skipped := statStatusSkipped.Value()
	require.True(t, s.handle(frame))
	assert.GreaterOrEqual(t, statStatusSkipped.Value(), skipped+1) // other tests' sessions may count too

	for i := range 3 {
		now = now.Add(5 * time.Second)
		allocs := testing.AllocsPerRun(10, func() { require.True(t, s.handle(frame)) })
		assert.Zero(t, allocs, "heartbeat %d", i)
		assert.Equal(t, now.UnixNano(), s.lastSeen.Load(), "the heartbeat is heard")
	}
	assert.GreaterOrEqual(t, statStatusSkipped.Value(), skipped+1+3*11, "each repeat counted as skipped")

	// A failed write forgets the frame: the next repeat is decoded and
	// written again (status; here its hash only, no database).
	s.statusMu.Lock()
	s.lastStatus, s.lastFrame = 0, 0
	s.statusMu.Unlock()
	assert.False(t, s.repeatsStatus(fnv64a(frame)))
}

// BenchmarkRepeatedHeartbeat: a heartbeat repeating the last status, its
// frame recognised (skipped undecoded) against decoded, re-encoded and
// hashed (the path before, and still a session's first status's).
func BenchmarkRepeatedHeartbeat(b *testing.B) {
	st := &agentproto.Status{ObservedGeneration: 3, Instances: []agentproto.InstanceStatus{{ID: "inst_1", State: "running"}},
		VolumeStore: agentproto.VolumeStore{AvailableBytes: 1 << 30}}
	frame, err := json.Marshal(agentproto.Message{Type: agentproto.TypeStatus, Status: st})
	require.NoError(b, err)
	canonical, err := json.Marshal(st)
	require.NoError(b, err)
	for _, forget := range []bool{false, true} {
		name := "frame repeated"
		if forget {
			name = "decoded"
		}
		b.Run(name, func(b *testing.B) {
			s := &session{g: &Gateway{o: Options{Now: time.Now}}}
			s.lastStatus, s.firstStatus = fnv64a(canonical), true
			require.True(b, s.handle(frame))
			b.ReportAllocs()
			for b.Loop() {
				if forget {
					s.lastFrame = 0
				}
				s.handle(frame)
			}
		})
	}
}
