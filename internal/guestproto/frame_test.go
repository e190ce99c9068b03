package guestproto

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// JSON lines and output frames interleave on one channel; noise before
// the port settled (a stray marker, a bad line) is skipped.
func TestReaderReadsLinesAndFrames(t *testing.T) {
	var in bytes.Buffer
	in.WriteString("garbage before the port settled\n")
	in.Write([]byte{FrameOutput, 0xff, '\n'}) // a marker whose header is no frame's
	line, _ := json.Marshal(Response{ID: 0, OK: true, Ready: &Ready{BootID: "b1"}})
	in.Write(append(line, '\n'))
	in.Write(AppendOutputFrame(nil, 7, 1, []byte("out\n{not json")))
	in.Write(AppendOutputFrame(nil, 7, 2, nil))
	line, _ = json.Marshal(Response{ID: 7, OK: true, Output: &Output{Fd: 1, Data: []byte("as a line")}})
	in.Write(append(line, '\n'))
	line, _ = json.Marshal(Response{ID: 7, OK: true, Exec: &ExecResult{ExitCode: 3}})
	in.Write(line) // the last line without its newline

	rd := NewReader(&in)
	var got []Response
	for {
		r, err := rd.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		got = append(got, r)
	}
	require.Len(t, got, 5)
	assert.Equal(t, "b1", got[0].Ready.BootID)
	assert.Equal(t, Response{ID: 7, OK: true, Output: &Output{Fd: 1, Data: []byte("out\n{not json")}}, got[1])
	assert.Equal(t, Response{ID: 7, OK: true, Output: &Output{Fd: 2, Data: []byte{}}}, got[2])
	assert.Equal(t, "as a line", string(got[3].Output.Data))
	assert.Equal(t, 3, got[4].Exec.ExitCode)
}

// A frame's data may be larger than the reader's buffer; a line longer
// than MaxLineBytes is an error, not a silent cut.
func TestReaderLimits(t *testing.T) {
	big := bytes.Repeat([]byte{'x'}, 300<<10)
	r, err := NewReader(bytes.NewReader(AppendOutputFrame(nil, 1, 1, big))).Next()
	require.NoError(t, err)
	assert.Equal(t, big, r.Output.Data)

	_, err = NewReader(bytes.NewReader(bytes.Repeat([]byte{'{'}, MaxLineBytes+1))).Next()
	assert.ErrorIs(t, err, errLineTooLong)
}

// Whatever the guest channel carries, the reader answers responses or an
// error and never panics; an output it returns, framed again, reads back
// the same.
func FuzzReader(f *testing.F) {
	f.Add(AppendOutputFrame(nil, 1, 1, []byte("hi")))
	f.Add([]byte(`{"id":1,"ok":true,"output":{"fd":1,"data":"aGk="}}` + "\n"))
	f.Add(append(AppendOutputFrame(nil, 2, 2, nil), []byte(`{"id":2,"ok":true,"exec":{"exitCode":0}}`)...))
	f.Add([]byte{FrameOutput, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		rd := NewReader(bytes.NewReader(b))
		for i := 0; ; i++ {
			require.LessOrEqual(t, i, len(b), "each response consumes input")
			r, err := rd.Next()
			if err != nil {
				return
			}
			if o := r.Output; o != nil && r.ID != 0 && (o.Fd == 1 || o.Fd == 2) && len(o.Data) <= MaxFrameData {
				again, err := NewReader(bytes.NewReader(AppendOutputFrame(nil, r.ID, o.Fd, o.Data))).Next()
				require.NoError(t, err)
				require.Equal(t, r.ID, again.ID)
				require.Equal(t, o.Fd, again.Output.Fd)
				require.Equal(t, string(o.Data), string(again.Output.Data))
			}
		}
	})
}

// What one 32 KiB chunk of output costs the guest to encode and the host
// to decode, as a JSON line with base64 and as a frame (bytes on the port
// reported as wire-B/op).
func BenchmarkOutputChunk(b *testing.B) {
	data := bytes.Repeat([]byte{0}, 32<<10)
	b.Run("json", func(b *testing.B) {
		var wire int
		for b.Loop() {
			line, _ := json.Marshal(Response{ID: 7, OK: true, Output: &Output{Fd: 1, Data: data}})
			line = append(line, '\n')
			wire = len(line)
			if _, err := NewReader(bytes.NewReader(line)).Next(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(wire), "wire-B/op")
	})
	b.Run("frame", func(b *testing.B) {
		var wire int
		var buf []byte
		for b.Loop() {
			buf = AppendOutputFrame(buf[:0], 7, 1, data)
			wire = len(buf)
			if _, err := NewReader(bytes.NewReader(buf)).Next(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(wire), "wire-B/op")
	})
}
