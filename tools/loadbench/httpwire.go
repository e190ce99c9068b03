package main

// The benchmark's own HTTP/1.1 client side, kept lean so that one core can
// send 150 % of what the server serves: a request is bytes encoded once
// per call kind (a few digits patched per call), and an answer is read for
// its status line, the two headers the benchmark needs (Content-Length,
// Retry-After, plus the framing ones) and its body's length, without a
// header map or a decoder. net/http's client spent most of the generator's
// core on its own bookkeeping (a Request, a Header map, a goroutine pair
// per connection, the generated client's JSON) and could not send 8,600
// calls/s from one core.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http/httputil"
	"strconv"
)

// requestTemplate is one call kind's request, encoded once. Fields are
// fixed-width decimal counters patched into a copy per call (so the
// Content-Length never changes).
type requestTemplate struct {
	raw    []byte
	fields []counterField
}

// counterField is a run of width digits at off that holds n mod mod (0:
// no modulus) for the call numbered n.
type counterField struct {
	off, width int
	mod        int64
}

// newRequest encodes a POST of body to path. In body, each "%0Nd"
// placeholder (N digits wide) becomes a counter field; mods gives each
// field's modulus in order (0 or missing: none).
func newRequest(host, path, token, body string, mods ...int64) (*requestTemplate, error) {
	var fields []counterField
	var b []byte
	for i, k := 0, 0; i < len(body); {
		if body[i] == '%' && i+3 < len(body) && body[i+1] == '0' {
			j := i + 2
			for j < len(body) && body[j] >= '0' && body[j] <= '9' {
				j++
			}
			if j < len(body) && body[j] == 'd' && j > i+2 {
				w, _ := strconv.Atoi(body[i+2 : j])
				f := counterField{off: len(b), width: w}
				if k < len(mods) {
					f.mod = mods[k]
				}
				k++
				fields = append(fields, f)
				b = append(b, bytes.Repeat([]byte{'0'}, w)...)
				i = j + 1
				continue
			}
		}
		b = append(b, body[i])
		i++
	}
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Service: 1\r\n", path, host)
	if token != "" {
		head += "Authorization: Bearer " + token + "\r\n"
	}
	head += "Content-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n"
	t := &requestTemplate{raw: append([]byte(head), b...)}
	for _, f := range fields {
		f.off += len(head)
		t.fields = append(t.fields, f)
	}
	return t, nil
}

// encode writes call n's request into dst (reused) and returns it.
func (t *requestTemplate) encode(dst []byte, n int64) []byte {
	dst = append(dst[:0], t.raw...)
	for _, f := range t.fields {
		v := n
		if f.mod > 0 {
			v %= f.mod
		}
		for i := f.off + f.width - 1; i >= f.off; i-- {
			dst[i] = byte('0' + v%10)
			v /= 10
		}
	}
	return dst
}

// response is what the benchmark keeps of an answer.
type response struct {
	Status int
	// RetryAfter is the Retry-After header's value, "" when absent.
	RetryAfter string
	// BodyLen is the body's length in bytes.
	BodyLen int64
	// Close is set when the server asked to close the connection.
	Close bool
	// Body holds up to len(keep) bytes of the body when keep is passed to
	// readResponse (error answers: their code and retryAfterMs).
	Body []byte
}

var (
	errMalformed   = errors.New("malformed HTTP response")
	errUnsupported = errors.New("unsupported HTTP response framing")
)

// maxLine bounds a status or header line (the reader's buffer size).
const maxLine = 4096

// readResponse reads one answer from br into r, skipping 1xx answers.
// keep, when not nil, receives the start of the body (r.Body aliases it).
// br must have a buffer of at least maxLine bytes.
func readResponse(br *bufio.Reader, r *response, keep []byte) error {
	for {
		*r = response{}
		if err := readHead(br, r); err != nil {
			return err
		}
		if r.Status >= 200 {
			break
		}
		if r.Status == 101 {
			return errUnsupported // a protocol switch the benchmark never asks for
		}
	}
	return readBody(br, r, keep)
}

// readHead reads the status line and headers.
func readHead(br *bufio.Reader, r *response) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	// "HTTP/1.x NNN reason": the reason phrase may be empty.
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return errMalformed
	}
	if line[7] == '0' {
		r.Close = true // HTTP/1.0: no keep-alive unless asked; the benchmark does not ask
	} else if line[7] != '1' {
		return errMalformed
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return errMalformed
		}
		r.Status = r.Status*10 + int(c-'0')
	}
	if r.Status < 100 {
		return errMalformed
	}
	r.BodyLen = -1
	chunked := false
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 {
			return errMalformed
		}
		value = bytes.TrimSpace(value)
		switch {
		case asciiEqualFold(name, "content-length"):
			n, err := parseLength(value)
			if err != nil || (r.BodyLen >= 0 && r.BodyLen != n) {
				return errMalformed // two different lengths: a smuggling shape
			}
			r.BodyLen = n
		case asciiEqualFold(name, "retry-after"):
			r.RetryAfter = string(value)
		case asciiEqualFold(name, "transfer-encoding"):
			if !asciiEqualFold(value, "chunked") {
				return errUnsupported
			}
			chunked = true
		case asciiEqualFold(name, "connection"):
			if asciiEqualFold(value, "close") {
				r.Close = true
			}
		}
	}
	if chunked {
		r.BodyLen = -2 // read by readBody
	}
	return nil
}

// readBody consumes the body whose framing readHead found.
func readBody(br *bufio.Reader, r *response, keep []byte) error {
	switch {
	case r.Status == 204 || r.Status == 304:
		r.BodyLen = 0
		return nil
	case r.BodyLen == -2:
		// Chunked: rare here (the envelope's answers fit net/http's
		// buffer and get a Content-Length), so the stdlib's reader.
		n, err := copyKeeping(httputil.NewChunkedReader(br), keep, r)
		r.BodyLen = n
		if err != nil {
			return unexpected(err)
		}
		// The chunked reader stops after the last chunk's line: the
		// trailer section (usually just its empty line) is ours to read.
		for {
			line, err := readLine(br)
			if err != nil || len(line) == 0 {
				return err
			}
		}
	case r.BodyLen == -1:
		// Neither: the body runs to the connection's end.
		r.Close = true
		n, err := copyKeeping(br, keep, r)
		r.BodyLen = n
		return err
	}
	n := r.BodyLen
	if len(keep) > 0 {
		k := int(min(n, int64(len(keep))))
		if _, err := io.ReadFull(br, keep[:k]); err != nil {
			return unexpected(err)
		}
		r.Body = keep[:k]
		n -= int64(k)
	}
	if _, err := br.Discard(int(n)); err != nil {
		return unexpected(err)
	}
	return nil
}

// copyKeeping reads src to its end, keeping its start in keep.
func copyKeeping(src io.Reader, keep []byte, r *response) (int64, error) {
	var k int
	if len(keep) > 0 {
		var err error
		k, err = io.ReadFull(src, keep)
		r.Body = keep[:k]
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return int64(k), nil
		}
		if err != nil {
			return int64(k), err
		}
	}
	n, err := io.Copy(io.Discard, src)
	return int64(k) + n, err
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readLine returns one line without its CRLF (or bare LF); the slice is
// valid until the next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if err == bufio.ErrBufferFull {
			return nil, errMalformed
		}
		return nil, unexpected(err)
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseLength parses a Content-Length: digits only, at most 18 of them.
func parseLength(v []byte) (int64, error) {
	if len(v) == 0 || len(v) > 18 {
		return 0, errMalformed
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, errMalformed
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

func asciiEqualFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// envelopeError picks the code and retryAfterMs out of an error answer's
// body ({"error": {"code": ..., "retryAfterMs": ...}, ...}) without a JSON
// decoder: the benchmark only counts them. ms is -1 when absent.
func envelopeError(body []byte) (code string, ms int64) {
	ms = -1
	if _, rest, ok := bytes.Cut(body, []byte(`"code":"`)); ok {
		if c, _, ok := bytes.Cut(rest, []byte(`"`)); ok {
			code = string(c)
		}
	}
	if _, rest, ok := bytes.Cut(body, []byte(`"retryAfterMs":`)); ok {
		var n int64
		i := 0
		for ; i < len(rest) && rest[i] >= '0' && rest[i] <= '9'; i++ {
			n = n*10 + int64(rest[i]-'0')
		}
		if i > 0 {
			ms = n
		}
	}
	return code, ms
}
