package notify_test

import (
	"testing"

	"computeplane/internal/config"
	"computeplane/internal/dbtest"
	"computeplane/internal/notify"
)

// BenchmarkWake is the cost Wake adds to each mutation on the caller's
// side (the envelope's AfterCommit), from all CPUs at once as under load.
// The NOTIFYs themselves are sent by the notifier's own goroutine, at most
// one per topic per SendInterval.
func BenchmarkWake(b *testing.B) {
	for _, kind := range []config.NotifierKind{config.NotifierNone, config.NotifierPostgres} {
		b.Run(string(kind), func(b *testing.B) {
			n := open(b, dbtest.URL(b), &config.Notifier{Kind: kind})
			ch, cancel := n.Subscribe(notify.TopicOutbox)
			defer cancel()
			stop := make(chan struct{})
			drained := make(chan struct{})
			go func() { // a subscriber, as a dispatcher would be
				defer close(drained)
				for {
					select {
					case <-ch:
					case <-stop:
						return
					}
				}
			}()
			defer func() { close(stop); <-drained }()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n.Wake(notify.TopicOutbox)
				}
			})
		})
	}
}
