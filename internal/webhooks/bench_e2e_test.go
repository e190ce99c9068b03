package webhooks_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"computeplane/computeclient"
	"computeplane/gen/client"
	"computeplane/internal/outbox"
	"computeplane/internal/testenv"
	"computeplane/internal/webhooks"
)

// BenchmarkCommitToDelivery measures commit-to-webhook latency (p50, p99)
// at a fast local receiver, with Run woken after each commit (what the
// notifier does) and with Run polling once a second (no notifier), and the
// deliveries per second of a burst. Each iteration commits one event and
// waits for its delivery.
func BenchmarkCommitToDelivery(b *testing.B) {
	for _, mode := range []struct {
		name string
		wake bool
	}{{"notifier", true}, {"poll-1s", false}} {
		b.Run(mode.name, func(b *testing.B) {
			env := testenv.Start(b, testenv.WithEnv("SERVICE_CONFIG", testenv.ConfigFile(b, "webhooks: {allowPrivateTargets: true}\n")))
			c := env.Client(b, computeclient.WithToken(env.Key(b, "acme", "mia", "member")))

			var mu sync.Mutex
			arrived := map[string]time.Time{}
			got := make(chan string, 1<<16)
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var ev outbox.CloudEvent
				_ = json.NewDecoder(r.Body).Decode(&ev)
				mu.Lock()
				arrived[ev.ID] = time.Now()
				mu.Unlock()
				got <- ev.ID
			}))
			defer srv.Close()
			_, err := c.WebhooksCreate(b.Context(), &client.WebhooksCreateInput{TenantId: "acme", URL: srv.URL + "/hook", Events: []string{"*"}})
			require.NoError(b, err)

			roots := x509.NewCertPool()
			roots.AddCert(srv.Certificate())
			e, err := webhooks.NewEngine(env.Store, webhooks.OptionsFrom(env.Config), webhooks.EngineOptions{RootCAs: roots})
			require.NoError(b, err)
			ctx, cancel := context.WithCancel(context.Background())
			wake := make(chan struct{}, 1)
			done := make(chan struct{})
			go func() { e.Run(ctx, nil, wake, time.Second); close(done) }()
			defer func() { cancel(); <-done }()

			seq := 0
			// commit writes n events in one transaction and returns the id
			// of the first and when the commit returned.
			commit := func(n int) (string, time.Time) {
				seq++
				subject := "s" + strconv.Itoa(seq)
				var first string
				require.NoError(b, env.Store.WithTx(context.Background(), false, func(ctx context.Context, tx pgx.Tx) error {
					for range n {
						if err := outbox.Write(ctx, tx, outbox.Event{Type: "site.created", Subject: subject, TenantID: "acme", Data: map[string]string{}}); err != nil {
							return err
						}
					}
					return tx.QueryRow(ctx, "SELECT id FROM outbox WHERE subject = $1 ORDER BY seq LIMIT 1", subject).Scan(&first)
				}))
				at := time.Now()
				if mode.wake {
					select {
					case wake <- struct{}{}:
					default:
					}
				}
				return first, at
			}

			var lat []time.Duration
			b.ResetTimer()
			for range b.N {
				id, at := commit(1)
				require.Equal(b, id, <-got)
				mu.Lock()
				lat = append(lat, arrived[id].Sub(at))
				mu.Unlock()
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")

			// A burst: deliveries per second.
			const burst = 500
			start := time.Now()
			commit(burst)
			for range burst {
				<-got
			}
			b.ReportMetric(burst/time.Since(start).Seconds(), "deliveries/s")
		})
	}
}
