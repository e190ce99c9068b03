package idem

import (
	"testing"

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
