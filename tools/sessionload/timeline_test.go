package main

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each daemon's times count from the timed restart's SIGKILL: only the
// first loss and first dial are kept, the welcomed dial is the one that
// got the welcome, and nothing is noted outside a timed restart.
func TestDaemonTimesKeepEachDaemonsRestart(t *testing.T) {
	nodes := []*node{{}, {}, {}}
	nodes[0].restart.lost() // no restart timed: not noted
	tl := startTimeline(3, new(atomic.Int64), make(chan struct{}, 1), nodes)
	// Taken as if the kill was 1 s ago, so that the times are far from 0.
	restartAt.Store(tl.killed.Add(-time.Second).UnixNano())
	for _, nd := range nodes[:2] {
		nd.restart.lost()
		nd.restart.dialed() // refused
	}
	time.Sleep(20 * time.Millisecond)
	nodes[0].restart.lost() // a second loss is not the first
	at := nodes[0].restart.dialed()
	time.Sleep(20 * time.Millisecond)
	nodes[0].restart.welcomed(at)
	nodes[1].restart.welcomed(0) // a dial started before the kill: not this restart's

	d0 := &nodes[0].restart
	assert.Less(t, d0.lostAt.Load(), d0.lastDial.Load(), "the first loss kept")
	assert.Less(t, d0.firstDial.Load(), d0.lastDial.Load(), "the first dial kept")
	assert.Equal(t, at, d0.lastDial.Load())
	assert.GreaterOrEqual(t, d0.backAt.Load()-d0.lastDial.Load(), int64(20*time.Millisecond))
	assert.GreaterOrEqual(t, d0.lostAt.Load(), int64(time.Second))
	assert.Zero(t, nodes[1].restart.backAt.Load())
	assert.Zero(t, nodes[2].restart.lostAt.Load())

	ds := tl.stop().daemons
	assert.Zero(t, restartAt.Load(), "stop ends the timed restart")
	require.Equal(t, 1, ds.count, "only the daemon welcomed counts")
	assert.InDelta(t, float64(d0.backAt.Load())/1e9, ds.back[3], 1e-9)
	assert.GreaterOrEqual(t, ds.dial[3], 0.02)
	assert.GreaterOrEqual(t, ds.lost[0], 1.0)

	// A new restart starts every daemon afresh.
	startTimeline(3, new(atomic.Int64), make(chan struct{}, 1), nodes).stop()
	assert.Zero(t, d0.backAt.Load())
}
