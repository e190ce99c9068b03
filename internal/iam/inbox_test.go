package iam_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/iam"
	"computeplane/internal/iam/embedded"
	"computeplane/internal/notify"
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

// An identity event's commit wakes the inbox (a NOTIFY in its
// transaction): a drain that would poll once an hour hears a role change
// and a revocation at once, through OnEvent.
func TestIdentityEventsWakeTheInbox(t *testing.T) {
	t.Parallel()
	st := dbtest.NewStore(t)
	svc := embedded.New(st, "root", "compute-", nil)
	cached := iam.NewCached(svc, nil)
	_, keyID, err := svc.CreateKey(t.Context(), embedded.KeyRequest{Tenant: "acme", Identity: "ann", Role: "owner"})
	require.NoError(t, err)

	n := notify.New(&config.Notifier{Kind: config.NotifierPostgres}, st.Pool(), nil)
	n.Start()
	t.Cleanup(n.Close)
	<-n.Listening()
	heard := make(chan iam.Event, 4)
	stop := cached.OnEvent(func(e iam.Event) { heard <- e })
	t.Cleanup(stop)
	wake, unsubscribe := n.Subscribe(iam.TopicInbox)
	t.Cleanup(unsubscribe)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		iam.DrainInboxWoken(ctx, svc, cached.React, time.Hour, wake, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	time.Sleep(100 * time.Millisecond) // the drain has read where the inbox ends

	next := func() iam.Event {
		select {
		case e := <-heard:
			return e
		case <-time.After(time.Second):
			t.Fatal("the event was not heard within a second")
			return iam.Event{}
		}
	}
	_, err = svc.SetRole(t.Context(), "acme", "ann", "viewer")
	require.NoError(t, err)
	e := next()
	require.Equal(t, "role.changed", e.Type)
	require.Equal(t, "ann", e.IdentityID)
	require.Empty(t, e.Session)

	require.NoError(t, svc.RevokeKey(t.Context(), keyID))
	e = next()
	require.Equal(t, "credential.revoked", e.Type)
	require.Equal(t, "key:"+keyID, e.Session)
}
