package pki_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/pki"
)

// Every holder of a bundle derives the same ticket key for a period; other
// periods and other bundles (another node CA) derive other keys.
func TestSessionTicketKey(t *testing.T) {
	t.Parallel()
	b, err := pki.Generate("test.local")
	require.NoError(t, err)
	k1, err := b.SessionTicketKey(100)
	require.NoError(t, err)
	again, err := b.SessionTicketKey(100)
	require.NoError(t, err)
	assert.Equal(t, k1, again)
	next, err := b.SessionTicketKey(101)
	require.NoError(t, err)
	assert.NotEqual(t, k1, next)
	other, err := pki.Generate("test.local")
	require.NoError(t, err)
	ko, err := other.SessionTicketKey(100)
	require.NoError(t, err)
	assert.NotEqual(t, k1, ko)
	assert.NotEqual(t, [32]byte{}, k1)
}
