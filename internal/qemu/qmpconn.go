package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// qmpConn is one QMP connection, the one a VM holds for its commands
// (VM.command): a connection per command would pay qemu's greeting and
// capability negotiation each time (about 4 ms of a warm claim's resume
// on a loaded machine). It can pass a file descriptor (getfd), which lets
// qemu read a saved state from a file we opened instead of forking a
// shell and cat for an exec: migration.
type qmpConn struct {
	c *net.UnixConn
	r *bufio.Reader
}

// dialQMP connects to a QMP socket and negotiates its capabilities.
func dialQMP(ctx context.Context, path string) (*qmpConn, error) {
	d := net.Dialer{Timeout: QMPTimeout}
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qemu: QMP: %w", err)
	}
	q := &qmpConn{c: c.(*net.UnixConn), r: bufio.NewReader(c)}
	if err := q.deadline(ctx); err != nil {
		q.close()
		return nil, err
	}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		q.close()
		return nil, fmt.Errorf("qemu: QMP greeting: %w", err)
	}
	if _, err := q.run(ctx, `{"execute":"qmp_capabilities"}`, nil); err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

func (q *qmpConn) close() { _ = q.c.Close() }

// deadline bounds the next exchange by QMPTimeout and ctx.
func (q *qmpConn) deadline(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := time.Now().Add(QMPTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	return q.c.SetDeadline(d)
}

// run sends one command, with file's descriptor attached when given
// (SCM_RIGHTS, for getfd), and returns its "return" member; events
// that arrive meanwhile are skipped.
func (q *qmpConn) run(ctx context.Context, cmd string, file *os.File) (json.RawMessage, error) {
	if err := q.deadline(ctx); err != nil {
		return nil, err
	}
	var oob []byte
	if file != nil {
		oob = unix.UnixRights(int(file.Fd()))
	}
	if _, _, err := q.c.WriteMsgUnix([]byte(cmd+"\n"), oob, nil); err != nil {
		return nil, fmt.Errorf("qemu: QMP: %w", err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qemu: QMP: %w", err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qemu: QMP: %w", err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, &qmpError{Class: resp.Error.Class, Desc: resp.Error.Desc}
		case resp.Return == nil:
			return nil, errors.New("qemu: QMP: an answer without return or error")
		}
		return resp.Return, nil
	}
}

// qmpError is qemu's answer that a command failed; the connection it came
// on is still good (any other error of run leaves it in an unknown state).
type qmpError struct{ Class, Desc string }

func (e *qmpError) Error() string { return "qemu: QMP " + e.Class + ": " + e.Desc }
