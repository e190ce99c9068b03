package iam_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
)

// A revoked key stops working as soon as the inbox is drained, long before
// the 30 s credential cache would have let it go.
func TestRevocationThroughTheInboxDropsTheCache(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	svc := embedded.New(st, "root", "compute-", nil)
	cached := iam.NewCached(svc, nil)
	token, keyID, err := svc.CreateKey(t.Context(), embedded.KeyRequest{Tenant: "acme", Identity: "ann", Role: "owner"})
	require.NoError(t, err)
	cred := iam.Credential{Token: token}
	_, err = cached.Authenticate(t.Context(), cred)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		iam.DrainInbox(ctx, svc, cached.React, 20*time.Millisecond, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	// Still cached: the identity service is not asked again.
	time.Sleep(50 * time.Millisecond)
	_, err = cached.Authenticate(t.Context(), cred)
	require.NoError(t, err)

	require.NoError(t, svc.RevokeKey(t.Context(), keyID))
	require.Eventually(t, func() bool {
		_, err := cached.Authenticate(t.Context(), cred)
		return err != nil
	}, 2*time.Second, 20*time.Millisecond, "the revocation reaches the cache through the inbox")
}
