package keys

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPurposesGetDifferentKeys(t *testing.T) {
	t.Parallel()
	secret := "0123456789abcdef0123456789abcdef"
	seen := map[string]bool{}
	for _, p := range []string{Secrets, PKI, Webhooks, Cursors} {
		k := Derive(secret, p)
		assert.Len(t, k, Size)
		assert.Equal(t, k, Derive(secret, p), "deterministic")
		assert.NotEqual(t, k, Derive(secret+"x", p), "depends on the secret")
		assert.False(t, seen[string(k)], p)
		seen[string(k)] = true
	}
}
