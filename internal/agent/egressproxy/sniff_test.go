package egressproxy

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clientHello is what crypto/tls's client sends first for serverName,
// as a VM's TLS client would (TLS 1.2 and 1.3 offered).
func clientHello(t testing.TB, serverName string, maxVersion uint16) []byte {
	t.Helper()
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		c := tls.Client(client, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == "", MaxVersion: maxVersion})
		_ = c.Handshake() // fails once the pipe closes
		_ = client.Close()
	}()
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hello []byte
	buf := make([]byte, 64<<10)
	// The hello is one record: its header says how long.
	for len(hello) < 5 || len(hello) < 5+int(hello[3])<<8|int(hello[4]) {
		n, err := server.Read(buf)
		require.NoError(t, err)
		hello = append(hello, buf[:n]...)
	}
	return hello
}

func TestPeekNameReadsTheServerNameOfAClientHello(t *testing.T) {
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		hello := clientHello(t, "Upstream.Test", v)
		rest := []byte("more bytes the client sent")
		stream := append(append([]byte(nil), hello...), rest...)
		name, seen, err := peekName(bytes.NewReader(stream))
		require.NoError(t, err)
		assert.Equal(t, "upstream.test", name, "lowercased")
		assert.True(t, len(seen) >= len(hello) && bytes.HasPrefix(stream, seen), "seen is the hello and what came with it, sent upstream first")
	}
	// No SNI (a client dialing an address) names nothing.
	_, _, err := peekName(bytes.NewReader(clientHello(t, "", tls.VersionTLS13)))
	assert.ErrorIs(t, err, errNoName)
}

func TestPeekNameReadsTheHostOfAnHTTPRequest(t *testing.T) {
	for req, want := range map[string]string{
		"GET / HTTP/1.1\r\nHost: Upstream.Test:8080\r\nUser-Agent: x\r\n\r\n":        "upstream.test",
		"GET http://example.com./x HTTP/1.1\r\nHost: example.com\r\n\r\n":            "example.com",
		"POST /p HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 4\r\n\r\nbody": "api.example.com",
	} {
		name, seen, err := peekName(strings.NewReader(req))
		require.NoError(t, err, req)
		assert.Equal(t, want, name, req)
		assert.True(t, strings.HasPrefix(req, string(seen)), "seen is a prefix of the stream")
	}
	for _, req := range []string{
		"GET / HTTP/1.0\r\n\r\n",                        // no Host
		"GET / HTTP/1.1\r\nHost: 198.51.100.10\r\n\r\n", // an address is no name
		"SSH-2.0-OpenSSH_9.2\r\n",                       // not HTTP
		"",                                              // nothing
		"\x16\x03\x01\x00\x05hello",                     // a broken handshake record
	} {
		_, _, err := peekName(strings.NewReader(req))
		assert.Error(t, err, "%q", req)
	}
}

func TestPeekNameReadsAtMostMaxPeek(t *testing.T) {
	huge := "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 2*maxPeek) + "\r\nHost: a.example\r\n\r\n"
	r := &countingReader{r: strings.NewReader(huge)}
	_, seen, err := peekName(r)
	assert.Error(t, err)
	assert.LessOrEqual(t, r.n, maxPeek)
	assert.LessOrEqual(t, len(seen), maxPeek)
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestAllowedMatchesNamesAndSubdomains(t *testing.T) {
	a := NewAllowed([]string{"example.com", "*.pypi.org", "Files.Example.NET."})
	for name, want := range map[string]bool{
		"example.com":           true,
		"www.example.com":       false, // an exact entry: not its subdomains
		"pypi.org":              false, // "*." is the subdomains only
		"files.pypi.org":        true,
		"a.b.pypi.org":          true,
		"evilpypi.org":          false,
		"files.example.net":     true,
		"example.com.evil.test": false,
		"":                      false,
	} {
		assert.Equal(t, want, a.Admits(name), name)
	}
	assert.True(t, NewAllowed(nil).Empty())
}

// FuzzPeekName: whatever a VM sends first, peeking never panics, never
// reads past maxPeek, returns as seen exactly the bytes it read, and a
// name it returns is normalized.
func FuzzPeekName(f *testing.F) {
	f.Add(clientHello(f, "upstream.test", tls.VersionTLS13))
	f.Add(clientHello(f, "a.example", tls.VersionTLS12))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: upstream.test\r\n\r\n"))
	f.Add([]byte("\x16\x03\x01\x00\x00"))
	f.Add([]byte{0x16})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &countingReader{r: bytes.NewReader(data)}
		name, seen, err := peekName(r)
		if r.n > maxPeek {
			t.Fatalf("read %d bytes", r.n)
		}
		if !bytes.Equal(seen, data[:r.n]) {
			t.Fatalf("seen %d bytes of %d read", len(seen), r.n)
		}
		if err == nil && (name == "" || name != normalize(name)) {
			t.Fatalf("name %q is not normalized", name)
		}
	})
}
