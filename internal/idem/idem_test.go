package idem

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
)

func TestFingerprintAndCheck(t *testing.T) {
	t.Parallel()
	m := &api.Method{Idempotency: &api.Idempotency{Key: "idempotencyKey", Compare: []string{"kind", "region", "iamRegion"}}}
	a := Fingerprint(m, map[string]any{"kind": "custom", "region": "eu", "idempotencyKey": "k", "tenantId": "t"})
	assert.JSONEq(t, `{"kind":"custom","region":"eu"}`, string(a))
	require.NoError(t, Check(m, a, Fingerprint(m, map[string]any{"region": "eu", "kind": "custom", "wait": map[string]any{"timeoutMs": 5}})))

	err := Check(m, a, Fingerprint(m, map[string]any{"kind": "custom", "region": "us"}))
	var se *api.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, api.CodeConflict, se.Code)
	assert.Equal(t, "region", se.Details["field"])

	err = Check(m, a, Fingerprint(m, map[string]any{"kind": "custom", "region": "eu", "iamRegion": "eu"}))
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "iamRegion", se.Details["field"], "given versus absent differs")
}

func TestForDerivesTheSameKeyForARetry(t *testing.T) {
	t.Parallel()
	m := &api.Method{Idempotency: &api.Idempotency{Key: "idempotencyKey", IDPrefix: "thing", Compare: []string{"name"}}}
	type input struct {
		TenantID       string `json:"tenantId"`
		IdempotencyKey string `json:"idempotencyKey"`
		Name           string `json:"name"`
	}
	in := input{TenantID: "t1", IdempotencyKey: "k", Name: "a"}
	k := For(m, "t1", "alice", "k", in)
	assert.Equal(t, k, For(m, "t1", "alice", "k", in))
	assert.Equal(t, ID(m, "t1", "alice", "k"), k.ID)
	assert.Contains(t, k.ID, "thing")
	assert.JSONEq(t, `{"name":"a"}`, string(k.Fingerprint))
	assert.NotEqual(t, k.ID, For(m, "t1", "bob", "k", in).ID, "another caller's key is another create")
	assert.NotEqual(t, k.ID, For(m, "t2", "alice", "k", in).ID)
	assert.NotEqual(t, k.ID, For(m, "t1", "alice", "k2", in).ID)
}

func TestReplay(t *testing.T) {
	t.Parallel()
	m := &api.Method{Idempotency: &api.Idempotency{Key: "idempotencyKey", Compare: []string{"name"}}}
	k := Key{Method: m, ID: "thing-1", Fingerprint: Fingerprint(m, map[string]any{"name": "a"})}

	replay, err := k.Replay(nil, pgx.ErrNoRows)
	require.NoError(t, err, "no row yet: the create goes on")
	assert.False(t, replay)

	replay, err = k.Replay(nil, fmt.Errorf("get: %w", pgx.ErrNoRows))
	require.NoError(t, err)
	assert.False(t, replay)

	other := errors.New("connection lost")
	replay, err = k.Replay(nil, other)
	require.ErrorIs(t, err, other)
	assert.False(t, replay)

	replay, err = k.Replay(Fingerprint(m, map[string]any{"name": "a"}), nil)
	require.NoError(t, err)
	assert.True(t, replay, "the same request: answer with the stored row")

	replay, err = k.Replay(Fingerprint(m, map[string]any{"name": "b"}), nil)
	var se *api.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, api.CodeConflict, se.Code)
	assert.Equal(t, "name", se.Details["field"])
	assert.False(t, replay)
}
