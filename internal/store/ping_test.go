package store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
	"computeplane/internal/store"
)

// pingCounter is a proxy in front of a test database's Unix socket that
// counts the liveness pings (the simple query "-- ping" pgxpool sends when
// it hands out an idle connection) the clients send through it.
type pingCounter struct {
	url   string // the database's URL through the proxy
	pings atomic.Int64
}

func countPings(t *testing.T, dbURL string) *pingCounter {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	require.True(t, filepath.IsAbs(cfg.Host), "the test database is reached on a Unix socket (scripts/devdb.sh)")
	target := filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port)))
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(int(cfg.Port))))
	require.NoError(t, err)
	p := &pingCounter{}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); p.scan(c, s); _ = s.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("host", dir)
	u.RawQuery = q.Encode()
	p.url = u.String()
	return p
}

// scan forwards the client's messages to the server, counting the pings:
// the startup message (no type byte), then typed messages.
func (p *pingCounter) scan(client io.Reader, server io.Writer) {
	var hdr [5]byte
	if _, err := io.ReadFull(client, hdr[:4]); err != nil {
		return
	}
	n := int(binary.BigEndian.Uint32(hdr[:4]))
	body := make([]byte, n-4)
	if _, err := io.ReadFull(client, body); err != nil {
		return
	}
	if _, err := server.Write(append(hdr[:4:4], body...)); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(hdr[1:]))-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		if hdr[0] == 'Q' && bytes.Equal(bytes.TrimRight(body, "\x00"), []byte("-- ping")) {
			p.pings.Add(1)
		}
		if _, err := server.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}

// TestIdleConnectionIsNotPingedOnTheCallsPath: a call on a connection idle
// for longer than pgxpool's default (1 s) but less than PingAfterIdle
// sends no ping before its statements (the round trip a process serving
// few calls paid on every one); past PingAfterIdle it is pinged, so a
// connection dropped long ago is still found before use.
func TestIdleConnectionIsNotPingedOnTheCallsPath(t *testing.T) {
	if testing.Short() {
		t.Skip("waits past the ping's idle threshold")
	}
	t.Parallel()
	p := countPings(t, dbtest.URL(t))
	s, err := store.Open(t.Context(), p.url)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	call := func(readOnly bool) {
		var one int
		require.NoError(t, s.WithTx(t.Context(), readOnly, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, "select 1").Scan(&one)
		}))
		require.Equal(t, 1, one)
	}
	for _, readOnly := range []bool{false, true} {
		call(readOnly)
	}
	p.pings.Store(0)
	time.Sleep(1500 * time.Millisecond) // past pgxpool's default of 1 s
	call(false)
	call(true)
	assert.Zero(t, p.pings.Load(), "a connection idle for 1.5 s is handed out without a ping")

	time.Sleep(store.PingAfterIdle + 500*time.Millisecond)
	call(false)
	assert.Positive(t, p.pings.Load(), "a connection idle past PingAfterIdle is pinged first")
}
