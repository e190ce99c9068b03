package guestproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
)

// Output frames. A host that sets Request.BinaryOutput on a start or a
// dial gets that stream's output as binary frames instead of JSON lines
// with base64 data (a third more bytes, and the guest encoding every
// chunk in an emulated CPU):
//
//	FrameOutput, request ID (8 bytes), fd (1 byte), length (4 bytes), data
//
// integers big endian. A JSON line starts with '{', never with
// FrameOutput, so one reader (Reader) tells the two apart by the first
// byte. Control messages (responses, the end of a stream, Ready) stay
// JSON lines. A guest older than the flag ignores it and sends JSON
// lines, which Reader still reads: the negotiation is per stream.
const FrameOutput byte = 0

// MaxFrameData bounds one frame's data.
const MaxFrameData = 1 << 20

const frameHeader = 1 + 8 + 1 + 4

// AppendOutputFrame appends the frame of one output chunk to dst.
func AppendOutputFrame(dst []byte, id uint64, fd int, data []byte) []byte {
	dst = append(dst, FrameOutput)
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = append(dst, byte(fd))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(data)))
	return append(dst, data...)
}

// Reader reads what the guest writes: JSON lines and output frames.
type Reader struct {
	r *bufio.Reader
}

// NewReader reads r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next is the next response; an output frame comes as a Response with
// Output set (its Data the caller's). What is neither a JSON response
// nor a valid frame header (bytes the guest wrote before the port
// settled) is skipped up to the next newline. The error is the channel's
// (io.EOF at its end) or a line longer than MaxLineBytes.
func (d *Reader) Next() (Response, error) {
	for {
		b, err := d.r.Peek(1)
		if err != nil {
			return Response{}, err
		}
		if b[0] == FrameOutput {
			if r, ok, err := d.frame(); err != nil || ok {
				return r, err
			}
			if err := d.skipLine(); err != nil {
				return Response{}, err
			}
			continue
		}
		line, err := d.line()
		if err != nil {
			return Response{}, err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var r Response
		if json.Unmarshal(line, &r) == nil {
			return r, nil
		}
	}
}

// frame reads an output frame; ok false (nothing consumed but the marker)
// when its header is not one.
func (d *Reader) frame() (Response, bool, error) {
	h, err := d.r.Peek(frameHeader)
	if err != nil {
		return Response{}, false, err
	}
	id, fd, n := binary.BigEndian.Uint64(h[1:9]), int(h[9]), binary.BigEndian.Uint32(h[10:14])
	if id == 0 || (fd != 1 && fd != 2) || n > MaxFrameData {
		_, _ = d.r.Discard(1)
		return Response{}, false, nil
	}
	_, _ = d.r.Discard(frameHeader)
	data := make([]byte, n)
	if _, err := io.ReadFull(d.r, data); err != nil {
		return Response{}, false, err
	}
	return Response{ID: id, OK: true, Output: &Output{Fd: fd, Data: data}}, true, nil
}

var errLineTooLong = errors.New("guestproto: a line longer than MaxLineBytes")

// line reads up to and including the next newline (or the end).
func (d *Reader) line() ([]byte, error) {
	var long []byte
	for {
		b, err := d.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(long)+len(b) > MaxLineBytes {
				return nil, errLineTooLong
			}
			long = append(long, b...)
			continue
		}
		if long != nil {
			b = append(long, b...)
		}
		if len(b) > MaxLineBytes {
			return nil, errLineTooLong
		}
		if err == io.EOF && len(b) > 0 {
			return b, nil
		}
		return b, err
	}
}

func (d *Reader) skipLine() error {
	for {
		_, err := d.r.ReadSlice('\n')
		if err != bufio.ErrBufferFull {
			return err
		}
	}
}
