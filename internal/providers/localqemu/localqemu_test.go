package localqemu

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/providers"
)

func client(t *testing.T, account string) *Provider {
	t.Helper()
	p, err := New(providers.Env{Dir: t.TempDir(), AccountID: account},
		json.RawMessage(`{"image": "computeplane/minimal", "machineTypes": [{"name": "small", "vcpu": 1, "memoryMiB": 256}]}`))
	require.NoError(t, err)
	return p.(*Provider)
}

func TestOffersAndDefaults(t *testing.T) {
	t.Parallel()
	p := client(t, "pacct_a")
	offers, err := p.Offers(t.Context(), providers.Query{})
	require.NoError(t, err)
	require.Len(t, offers, 1)
	assert.Equal(t, providers.Offer{ID: "small", Kind: "vps", Region: Region, VCPU: 1, MemoryMiB: 256}, offers[0])
	assert.Equal(t, "tcg", p.cfg.Accel)
	assert.Equal(t, 4, p.cfg.MaxMachines)
}

func TestMachinesAreTheAccountsOnly(t *testing.T) {
	t.Parallel()
	p := client(t, "pacct_a")
	ctx := context.Background()
	for _, id := range []string{"", "../etc", "lq_../../x", "lq_ABC", "other", "lq_" + string(make([]byte, 40))} {
		_, err := p.Identify(ctx, id)
		assert.ErrorIs(t, err, providers.ErrNoMachine, id)
	}
	// A machine another account made is not found by this one.
	id := "lq_0123456789abcdefghjkmnpqrs"
	require.NoError(t, os.MkdirAll(filepath.Join(p.env.Dir, id), 0o700))
	b, _ := json.Marshal(meta{ID: id, AccountID: "pacct_b", OfferID: "small", VCPU: 1, MemoryMiB: 256})
	require.NoError(t, os.WriteFile(filepath.Join(p.env.Dir, id, "machine.json"), b, 0o600))
	_, err := p.Identify(ctx, id)
	assert.ErrorIs(t, err, providers.ErrNoMachine)
	assert.ErrorIs(t, p.Release(ctx, id), providers.ErrNoMachine)
	// Its own: found, stopped (no VM runs).
	b, _ = json.Marshal(meta{ID: id, AccountID: "pacct_a", OfferID: "small", VCPU: 1, MemoryMiB: 256})
	require.NoError(t, os.WriteFile(filepath.Join(p.env.Dir, id, "machine.json"), b, 0o600))
	m, err := p.Identify(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "stopped", m.State)
	assert.Equal(t, id, m.Hostname)
	assert.Error(t, p.Install(ctx, m, providers.Install{}), "a machine that does not run gets no daemon")
	require.NoError(t, p.Release(ctx, id))
	_, err = os.Stat(filepath.Join(p.env.Dir, id))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestClaimNeedsAnOfferAndAnImageSource(t *testing.T) {
	t.Parallel()
	p := client(t, "pacct_a")
	_, err := p.Claim(t.Context(), "huge", "k")
	assert.ErrorContains(t, err, "no offer huge")
	_, err = p.Claim(t.Context(), "small", "k")
	assert.ErrorContains(t, err, "no image source")
}
