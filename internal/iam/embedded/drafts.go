package embedded

import (
	"context"
	"log/slog"
	"time"

	"computeplane/internal/workers"
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

// DraftSweep is DraftSweepJob: a sweep of the drafts older than DraftTTL
// at once and then every DraftSweepEvery. A failed sweep is backed off by
// the runner.
func (s *Service) DraftSweep(log *slog.Logger) *workers.Periodic {
	return &workers.Periodic{Name: DraftSweepJob, Interval: DraftSweepEvery, Backoff: true, Log: log,
		Pass: func(ctx context.Context, _ workers.Fence) error {
			n, err := s.SweepDrafts(ctx, DraftTTL)
			if n > 0 {
				log.InfoContext(ctx, "swept stale authorization drafts", "count", n)
			}
			return err
		}}
}
