package qemu_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/guest"
	"computeplane/internal/guestproto"
	"computeplane/internal/qemu"
)

// A started program through the host's guest channel and a guest agent
// (in this process): stdin in, both outputs and the exit code out, and a
// program that outputs more than the window waits for the host's acks.
func TestStartStreamsAProgram(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer ln.Close()
	a := guest.NewAgent(slog.New(slog.DiscardHandler))
	a.Root = t.TempDir()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = a.Serve(context.Background(), c)
		}
	}()
	g, err := qemu.DialGuest(sock)
	require.NoError(t, err)
	defer g.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err = g.Ready(ctx)
	require.NoError(t, err)

	s, err := g.Start(ctx, &guestproto.Exec{Argv: []string{"sh", "-c", "read x; echo got $x; echo e >&2; exit 7"}})
	require.NoError(t, err)
	require.NoError(t, s.Input(ctx, guestproto.Input{Data: []byte("hi\n")}))
	var out, errOut strings.Builder
	for {
		r, err := s.Next(ctx)
		require.NoError(t, err)
		if r.Output == nil {
			require.True(t, r.OK, r.Error)
			assert.Equal(t, 7, r.Exec.ExitCode)
			break
		}
		if r.Output.Fd == 1 {
			out.Write(r.Output.Data)
		} else {
			errOut.Write(r.Output.Data)
		}
	}
	assert.Equal(t, "got hi\n", out.String())
	assert.Equal(t, "e\n", errOut.String())

	// 1 MiB of output: the guest stops at the window until acked.
	s, err = g.Start(ctx, &guestproto.Exec{Argv: []string{"sh", "-c", "head -c 1048576 /dev/zero"}})
	require.NoError(t, err)
	var got int64
	for got < guestproto.StreamWindow {
		r, err := s.Next(ctx)
		require.NoError(t, err)
		require.NotNil(t, r.Output)
		got += int64(len(r.Output.Data))
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = s.Next(short)
	stop()
	require.ErrorIs(t, err, context.DeadlineExceeded, "nothing more before an ack")
	require.NoError(t, s.Input(ctx, guestproto.Input{Ack: got}))
	for {
		r, err := s.Next(ctx)
		require.NoError(t, err)
		if r.Output == nil {
			break
		}
		got += int64(len(r.Output.Data))
		require.NoError(t, s.Input(ctx, guestproto.Input{Ack: int64(len(r.Output.Data))}))
	}
	assert.Equal(t, int64(1<<20), got)
}
