package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// ConsoleTail is how much of the console's past a console shows first.
const ConsoleTail = 64 << 10

// consolePoll is how often a console looks at the log without a wake-up
// (the log is written just after the socket, so a wake can be early).
const consolePoll = 50 * time.Millisecond

// A VM's serial console is qemu's socket chardev (Config.SerialSocket)
// whose logfile is console.log. The output is read from the log, which
// qemu writes whether a client is connected or not: a console starts
// with the log's tail (ConsoleTail) and follows it, with nothing lost or
// shown twice between the two. The socket carries the input, and its
// output only wakes the readers. qemu serves one client at a time, so the
// consoles open on a VM share one connection (a hub), closed with the
// last of them.
type consoleHub struct {
	path string
	conn net.Conn

	mu      sync.Mutex
	users   int
	changed chan struct{} // closed and replaced when output arrives
	done    bool          // the connection ended (the VM stopped)
}

var consoles = struct {
	sync.Mutex
	hubs map[string]*consoleHub
}{hubs: map[string]*consoleHub{}}

// Console is one reader and writer of a VM's serial console.
type Console struct {
	h      *consoleHub
	log    *os.File
	closed chan struct{}
	once   sync.Once
}

// OpenConsole opens the serial console of the VM started with c.
func OpenConsole(c *Config) (*Console, error) {
	if _, err := os.Stat(c.SerialSocket()); err != nil {
		return nil, errors.New("qemu: the VM has no console socket (started by an older compute-agent: restart it to get one)")
	}
	log, err := os.Open(c.Console())
	if err != nil {
		return nil, err
	}
	h, err := joinHub(c.SerialSocket())
	if err != nil {
		_ = log.Close()
		return nil, err
	}
	if st, err := log.Stat(); err == nil && st.Size() > ConsoleTail {
		// The tail, from the first whole line in it.
		buf := make([]byte, 4096)
		off := st.Size() - ConsoleTail
		n, _ := log.ReadAt(buf, off)
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			off += int64(i) + 1
		}
		_, _ = log.Seek(off, io.SeekStart)
	}
	return &Console{h: h, log: log, closed: make(chan struct{})}, nil
}

func joinHub(path string) (*consoleHub, error) {
	consoles.Lock()
	defer consoles.Unlock()
	if h := consoles.hubs[path]; h != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.done {
			h.users++
			return h, nil
		}
	}
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("qemu: the console socket: %w", err)
	}
	h := &consoleHub{path: path, conn: conn, users: 1, changed: make(chan struct{})}
	consoles.hubs[path] = h
	go h.read()
	return h, nil
}

// read discards the socket's output (the log has it) and wakes the
// consoles; its end is the VM's.
func (h *consoleHub) read() {
	buf := make([]byte, 4096)
	for {
		_, err := h.conn.Read(buf)
		h.mu.Lock()
		close(h.changed)
		h.changed = make(chan struct{})
		if err != nil {
			h.done = true
		}
		h.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (h *consoleHub) state() (<-chan struct{}, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed, h.done
}

func (h *consoleHub) leave() {
	consoles.Lock()
	defer consoles.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.users--; h.users == 0 {
		_ = h.conn.Close()
		h.done = true
		if consoles.hubs[h.path] == h {
			delete(consoles.hubs, h.path)
		}
	}
}

// Read is the console's output: the log's tail, then what follows, as it
// comes. It ends (io.EOF) when the VM stopped and the log is read.
func (c *Console) Read(p []byte) (int, error) {
	tick := time.NewTicker(consolePoll)
	defer tick.Stop()
	for {
		changed, done := c.h.state()
		n, err := c.log.Read(p)
		if n > 0 || (err != nil && err != io.EOF) {
			return n, err
		}
		if done {
			return 0, io.EOF
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
}

// Write types p on the console.
func (c *Console) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	_ = c.h.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.h.conn.Write(p)
}

// Close leaves the console (the connection closes with its last user).
func (c *Console) Close() error {
	c.once.Do(func() {
		close(c.closed)
		_ = c.log.Close()
		c.h.leave()
	})
	return nil
}
