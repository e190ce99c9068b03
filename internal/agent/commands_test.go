package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/agentproto"
)

func TestCommandsRunOnceAndOnlyWhenSigned(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	a := &Agent{dir: Dir(t.TempDir()), log: slog.New(slog.DiscardHandler),
		state: &State{NodeID: "node_a", CommandSigningKeys: [][]byte{pub}}}
	cmd := func(id, args string, key ed25519.PrivateKey) *agentproto.Command {
		c := &agentproto.Command{ID: id, NodeID: "node_a", Kind: agentproto.CommandEcho, Args: json.RawMessage(args), ExpiresAt: time.Now().Add(time.Minute)}
		c.Sign(key)
		return c
	}

	r := a.execute(cmd("cmd_1", `{"n":1}`, priv))
	require.True(t, r.OK, r.Error)
	assert.JSONEq(t, `{"n":1}`, string(r.Output))
	// The same id again, even with other args: the journaled result, not a
	// second run.
	r = a.execute(cmd("cmd_1", `{"n":2}`, priv))
	assert.JSONEq(t, `{"n":1}`, string(r.Output))

	r = a.execute(cmd("cmd_2", `{}`, other))
	assert.False(t, r.OK)
	assert.Contains(t, r.Error, "signature")
	c := cmd("cmd_3", `{}`, priv)
	c.NodeID = "node_b"
	r = a.execute(c)
	assert.False(t, r.OK, "a command for another node")
	expired := &agentproto.Command{ID: "cmd_4", NodeID: "node_a", Kind: agentproto.CommandEcho, Args: json.RawMessage(`{}`), ExpiresAt: time.Now().Add(-time.Second)}
	expired.Sign(priv)
	r = a.execute(expired)
	assert.Contains(t, r.Error, "expired")
	r = a.execute(cmd("../../etc/passwd", `{}`, priv))
	assert.False(t, r.OK, "an id that is not a file name")
}

// A node runs at most MaxGuestCommands guest commands; a re-send of one in
// flight is not run twice.
func TestGuestCommandsAreBounded(t *testing.T) {
	a := &Agent{inflight: map[string]bool{}}
	for i := range MaxGuestCommands {
		started, err := a.begin(fmt.Sprintf("cmd_%d", i))
		require.NoError(t, err)
		require.True(t, started)
	}
	started, err := a.begin("cmd_0")
	require.NoError(t, err)
	assert.False(t, started, "in flight already")
	_, err = a.begin("cmd_more")
	assert.ErrorIs(t, err, ErrBusy)
	a.finish("cmd_0")
	started, err = a.begin("cmd_more")
	require.NoError(t, err)
	assert.True(t, started)
}
