package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"computeplane/internal/guestproto"
)

// Stream is a program started in the guest (guestproto.OpStart): its
// output chunks and then its end, in order. The guest keeps at most
// guestproto.StreamWindow bytes unacknowledged, so the queue is bounded.
type Stream struct {
	g  *Guest
	id uint64

	mu   sync.Mutex
	q    []guestproto.Response
	wake chan struct{}
}

func (s *Stream) push(r guestproto.Response) {
	s.mu.Lock()
	s.q = append(s.q, r)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Start runs e in the guest and streams it.
func (g *Guest) Start(ctx context.Context, e *guestproto.Exec) (*Stream, error) {
	return g.open(ctx, guestproto.Request{Op: guestproto.OpStart, Exec: e})
}

// Dial connects to a TCP port of the guest's loopback (guestproto.OpDial)
// and streams the connection as Start streams a program.
func (g *Guest) Dial(ctx context.Context, port int) (*Stream, error) {
	return g.open(ctx, guestproto.Request{Op: guestproto.OpDial, Dial: &guestproto.Dial{Port: port}})
}

func (g *Guest) open(ctx context.Context, r guestproto.Request) (*Stream, error) {
	s := &Stream{g: g, id: g.nextID.Add(1), wake: make(chan struct{}, 1)}
	g.mu.Lock()
	if g.streams == nil {
		g.streams = map[uint64]*Stream{}
	}
	g.streams[s.id] = s
	g.mu.Unlock()
	r.ID = s.id
	r.BinaryOutput = true // a guest that predates it answers JSON lines
	if err := g.send(ctx, r); err != nil {
		g.mu.Lock()
		delete(g.streams, s.id)
		g.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// Next is the program's next response: Output set for a chunk; otherwise
// its end (Exec with the exit code, or an error).
func (s *Stream) Next(ctx context.Context) (guestproto.Response, error) {
	for {
		s.mu.Lock()
		if len(s.q) > 0 {
			r := s.q[0]
			s.q = s.q[1:]
			s.mu.Unlock()
			return r, nil
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-s.g.closed:
			return guestproto.Response{}, s.g.failure()
		case <-ctx.Done():
			return guestproto.Response{}, ctx.Err()
		}
	}
}

// Input sends stdin, its end, an ack or a kill, and waits for the guest
// to take it.
func (s *Stream) Input(ctx context.Context, in guestproto.Input) error {
	in.Proc = s.id
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := s.g.Call(ctx, guestproto.Request{Op: guestproto.OpInput, Input: &in})
	return err
}

// Close forgets the stream (its program killed first when it still runs).
func (s *Stream) Close() {
	s.g.mu.Lock()
	_, live := s.g.streams[s.id]
	delete(s.g.streams, s.id)
	s.g.mu.Unlock()
	if live {
		go func() { _ = s.Input(context.Background(), guestproto.Input{Kill: true}) }()
	}
}

// send writes one request line.
func (g *Guest) send(ctx context.Context, r guestproto.Request) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		_ = g.conn.SetWriteDeadline(dl)
	} else {
		_ = g.conn.SetWriteDeadline(time.Time{})
	}
	if _, err = g.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("qemu: guest channel: %w", err)
	}
	return nil
}
