package embedded

import (
	"context"
	"log/slog"
	"time"
)

// Drafts are written by PutDraft before a create's decision and made real
// or dropped when the call ends. A process killed in between leaves its
// draft behind; only a retry with the same key would touch it again. The
// iam role's singleton job DraftSweepJob removes drafts older than DraftTTL.
const (
	// DraftSweepJob is the singleton job (lease job/iam-draft-sweep).
	DraftSweepJob = "iam-draft-sweep"
	// DraftTTL is far beyond any call's bound (10 s): no live call holds a
	// draft that old.
	DraftTTL = 5 * time.Minute
	// DraftSweepEvery is how often the job sweeps.
	DraftSweepEvery = time.Minute
)

// SweepDrafts removes the drafts last written more than olderThan ago (by
// the service's clock, the one PutDraft stamps them with) and returns how
// many it removed. Real resources are never touched.
func (s *Service) SweepDrafts(ctx context.Context, olderThan time.Duration) (int64, error) {
	n, err := s.st.Queries().IAMSweepDrafts(ctx, s.now().Add(-olderThan))
	return n, wrapStore(err)
}

// SweepDraftsEvery sweeps at once and then every interval until ctx ends:
// the body of DraftSweepJob. A failed sweep returns its error, so the
// runner backs off and calls again.
func (s *Service) SweepDraftsEvery(ctx context.Context, every, olderThan time.Duration, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := s.SweepDrafts(ctx, olderThan)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if n > 0 {
			log.InfoContext(ctx, "swept stale authorization drafts", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
