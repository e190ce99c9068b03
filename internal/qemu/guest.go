package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"computeplane/internal/guestproto"
)

// Guest is a connection to compute-guest over the VM's guest channel.
// Calls may run concurrently; responses are matched by id.
type Guest struct {
	conn   net.Conn
	nextID atomic.Uint64
	wmu    sync.Mutex

	mu      sync.Mutex
	pending map[uint64]chan guestproto.Response
	streams map[uint64]*Stream    // started programs (stream.go)
	ready   chan guestproto.Ready // boot events
	closed  chan struct{}
	err     error
}

// DialGuest connects to the guest channel's socket.
func DialGuest(path string) (*Guest, error) {
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("qemu: guest channel: %w", err)
	}
	g := &Guest{conn: conn, pending: map[uint64]chan guestproto.Response{}, ready: make(chan guestproto.Ready, 4), closed: make(chan struct{})}
	go g.read()
	return g, nil
}

func (g *Guest) read() {
	// JSON lines and output frames; a line the guest wrote before the
	// port settled is skipped.
	rd := guestproto.NewReader(g.conn)
	var err error
	for {
		var r guestproto.Response
		if r, err = rd.Next(); err != nil {
			break
		}
		if r.ID == 0 && r.Ready != nil {
			select {
			case g.ready <- *r.Ready:
			default:
			}
			continue
		}
		g.mu.Lock()
		if st := g.streams[r.ID]; st != nil {
			if r.Output == nil {
				delete(g.streams, r.ID) // its end
			}
			g.mu.Unlock()
			st.push(r)
			continue
		}
		ch := g.pending[r.ID]
		delete(g.pending, r.ID)
		g.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	g.mu.Lock()
	g.err = err
	if errors.Is(err, io.EOF) {
		g.err = errors.New("qemu: the guest channel closed")
	}
	g.mu.Unlock()
	close(g.closed)
}

// Ready waits for the guest's boot event.
func (g *Guest) Ready(ctx context.Context) (guestproto.Ready, error) {
	select {
	case r := <-g.ready:
		return r, nil
	case <-g.closed:
		return guestproto.Ready{}, g.failure()
	case <-ctx.Done():
		return guestproto.Ready{}, ctx.Err()
	}
}

func (g *Guest) failure() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Call sends a request and waits for its response (bounded by ctx).
func (g *Guest) Call(ctx context.Context, r guestproto.Request) (guestproto.Response, error) {
	r.ID = g.nextID.Add(1)
	ch := make(chan guestproto.Response, 1)
	g.mu.Lock()
	g.pending[r.ID] = ch
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.pending, r.ID)
		g.mu.Unlock()
	}()
	b, err := json.Marshal(r)
	if err != nil {
		return guestproto.Response{}, err
	}
	g.wmu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		_ = g.conn.SetWriteDeadline(dl)
	}
	_, err = g.conn.Write(append(b, '\n'))
	g.wmu.Unlock()
	if err != nil {
		return guestproto.Response{}, fmt.Errorf("qemu: guest channel: %w", err)
	}
	select {
	case resp := <-ch:
		if !resp.OK {
			return resp, fmt.Errorf("guest: %s", resp.Error)
		}
		return resp, nil
	case <-g.closed:
		return guestproto.Response{}, g.failure()
	case <-ctx.Done():
		return guestproto.Response{}, ctx.Err()
	}
}

// Closed reports whether the channel has ended.
func (g *Guest) Closed() bool {
	select {
	case <-g.closed:
		return true
	default:
		return false
	}
}

// Close ends the connection.
func (g *Guest) Close() { _ = g.conn.Close() }

// UserDataPath is where user data lands in the guest.
const UserDataPath = "/run/user-data"

// RunUserData writes user data into the guest and, when it is a script
// (#!), runs it once, bounded by a minute; it returns the script's exit
// code (0 for data that is not a script). The data stays in the guest's
// memory (/run is a tmpfs).
func (g *Guest) RunUserData(ctx context.Context, userData string) (int, error) {
	if _, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpWriteFile,
		File: &guestproto.File{Path: UserDataPath, Data: []byte(userData), Mode: 0o700}}); err != nil {
		return 0, err
	}
	if !strings.HasPrefix(userData, "#!") {
		return 0, nil
	}
	resp, err := g.Call(ctx, guestproto.Request{Op: guestproto.OpExec, Exec: &guestproto.Exec{Argv: []string{UserDataPath}, TimeoutMs: 60_000}})
	if err != nil {
		return 0, fmt.Errorf("user data: %w", err)
	}
	return resp.Exec.ExitCode, nil
}
