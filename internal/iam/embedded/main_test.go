package embedded

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"computeplane/internal/dbtest"
	"computeplane/internal/iam"
	"computeplane/internal/store"
)

// testClock is an injected clock the tests move by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var epoch = time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)

// newTestService returns a service on a fresh database with root tenant
// "root" and the default prefix.
func newTestService(t *testing.T) (*Service, *store.Store, *testClock) {
	t.Helper()
	st := dbtest.NewStore(t)
	clk := &testClock{t: epoch}
	return New(st, "", "", clk.Now), st, clk
}

// mustKey creates a key and returns its token.
func mustKey(t *testing.T, s *Service, req KeyRequest) string {
	t.Helper()
	token, _, err := s.CreateKey(context.Background(), req)
	require.NoError(t, err)
	return token
}

// mustCaller creates a key and authenticates it.
func mustCaller(t *testing.T, s *Service, req KeyRequest) *iam.Caller {
	t.Helper()
	c, err := s.Authenticate(context.Background(), iam.Credential{Token: mustKey(t, s, req)})
	require.NoError(t, err)
	return c
}
