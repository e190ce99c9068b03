package egressproxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// maxPeek bounds what the proxy reads before it decides: a TLS
// ClientHello (post-quantum key shares make it about 2 KiB; a record
// holds at most 16 KiB plus its header) or an HTTP request's head.
const maxPeek = 32 << 10

var (
	errNoName    = errors.New("egressproxy: the connection names no host (no SNI, no Host header)")
	errNotParsed = errors.New("egressproxy: neither a TLS ClientHello nor an HTTP request")
	errGotHello  = errors.New("egressproxy: ClientHello read") // stops crypto/tls once it has the hello
)

// peekName reads the start of a client's stream, at most maxPeek bytes,
// and returns the host name it asks for: the server name (SNI) of a TLS
// ClientHello, or the Host of an HTTP/1 request, lowercased, without a
// port or trailing dot. seen is every byte read, to be sent upstream
// before the rest of the stream.
func peekName(r io.Reader) (name string, seen []byte, err error) {
	var rec bytes.Buffer
	tee := io.TeeReader(io.LimitReader(r, maxPeek), &rec)
	first := make([]byte, 1)
	if _, err := io.ReadFull(tee, first); err != nil {
		return "", rec.Bytes(), err
	}
	in := io.MultiReader(bytes.NewReader(first), tee)
	if first[0] == 0x16 { // a TLS handshake record
		name, err = tlsServerName(in)
	} else {
		name, err = httpHost(in)
	}
	if err != nil {
		return "", rec.Bytes(), err
	}
	name = normalize(name)
	if name == "" {
		return "", rec.Bytes(), errNoName
	}
	return name, rec.Bytes(), nil
}

// tlsServerName parses a ClientHello with crypto/tls itself: a server
// handshake on a read-only connection, stopped by GetConfigForClient as
// soon as the hello is parsed (nothing is ever written to the client).
func tlsServerName(r io.Reader) (string, error) {
	var name string
	got := false
	err := tls.Server(readOnly{r}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name, got = h.ServerName, true
		return nil, errGotHello
	}}).Handshake()
	if !got {
		if err == nil {
			err = errNotParsed
		}
		return "", errors.Join(errNotParsed, err)
	}
	return name, nil
}

// httpHost reads an HTTP/1 request's head and returns its host (the Host
// header, or the host of an absolute request URI).
func httpHost(r io.Reader) (string, error) {
	req, err := http.ReadRequest(bufio.NewReaderSize(r, 4096))
	if err != nil {
		return "", errors.Join(errNotParsed, err)
	}
	return req.Host, nil
}

// normalize lowercases a host, drops its port and a trailing dot; an IP
// literal is no name.
func normalize(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if net.ParseIP(strings.Trim(host, "[]")) != nil {
		return ""
	}
	return host
}

// readOnly is the connection crypto/tls parses a hello from: it reads r
// and writes nothing (a server handshake's alert goes nowhere).
type readOnly struct{ r io.Reader }

func (c readOnly) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (readOnly) Write(p []byte) (int, error)        { return 0, io.ErrClosedPipe }
func (readOnly) Close() error                       { return nil }
func (readOnly) LocalAddr() net.Addr                { return nil }
func (readOnly) RemoteAddr() net.Addr               { return nil }
func (readOnly) SetDeadline(t time.Time) error      { return nil }
func (readOnly) SetReadDeadline(t time.Time) error  { return nil }
func (readOnly) SetWriteDeadline(t time.Time) error { return nil }

// Allowed is a VM's domain allow list: an entry admits that name, a
// "*." entry every name below it (not the name itself), as E2B's and
// Daytona's do.
type Allowed struct {
	exact    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
}

// NewAllowed reads entries as the control plane normalizes them
// (lowercase, no trailing dot; internal/vmnet).
func NewAllowed(entries []string) Allowed {
	a := Allowed{exact: map[string]bool{}}
	for _, e := range entries {
		e = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(e)), ".")
		if rest, ok := strings.CutPrefix(e, "*."); ok {
			a.suffixes = append(a.suffixes, "."+rest)
		} else if e != "" {
			a.exact[e] = true
		}
	}
	return a
}

// Admits reports whether name (normalized) is allowed.
func (a Allowed) Admits(name string) bool {
	if name == "" {
		return false
	}
	if a.exact[name] {
		return true
	}
	for _, s := range a.suffixes {
		if len(name) > len(s) && strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// Empty reports whether the list admits nothing.
func (a Allowed) Empty() bool { return len(a.exact) == 0 && len(a.suffixes) == 0 }
