package system

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/store"
)

// Severities of findings.
const (
	SeverityInfo    = "info"
	SeverityWarning = "warning"
	SeverityError   = "error"
)

// Clock skew between this process and the database beyond which a finding
// is a warning, and an error.
const (
	SkewWarning = time.Second
	SkewError   = 5 * time.Second
)

// Check is one self check. Modules register their own; a check that returns
// an error becomes an error finding.
type Check struct {
	Name string
	Run  func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error)
}

// Migrations reports the migrations the database has applied and those this
// build knows.
type Migrations interface {
	MigrationStatus(ctx context.Context) (applied, known []int64, err error)
}

// WithChecks sets the checks selfCheck runs.
func (s *Service) WithChecks(checks ...Check) *Service {
	s.checks = append(s.checks, checks...)
	return s
}

// SelfCheck answers system.selfCheck: every check's findings; ok is false
// when any finding is an error.
func (s *Service) SelfCheck(ctx context.Context, _ *api.SystemSelfCheckInput) (*api.SelfCheck, error) {
	tx, ok := store.TxFromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("selfCheck runs without a transaction")
	}
	out := &api.SelfCheck{OK: true, Findings: []api.Finding{}}
	for _, c := range s.checks {
		findings, err := c.Run(ctx, tx)
		if err != nil {
			findings = append(findings, finding(c.Name, SeverityError, "check failed: "+err.Error()))
		}
		for _, f := range findings {
			if f.Severity == SeverityError {
				out.OK = false
			}
		}
		out.Findings = append(out.Findings, findings...)
	}
	return out, nil
}

func finding(check, severity, message string) api.Finding {
	return api.Finding{Check: check, Severity: severity, Message: message}
}

// CatalogCheck verifies the registry against the services: every registered
// method must be wired and every route unique.
func CatalogCheck(services *api.Services) Check {
	return Check{Name: "catalog", Run: func(context.Context, pgx.Tx) ([]api.Finding, error) {
		if err := services.Check(); err != nil {
			return []api.Finding{finding("catalog", SeverityError, err.Error())}, nil
		}
		var out []api.Finding
		routes := map[string]bool{}
		registered := 0
		for _, m := range api.Methods {
			if routes[m.Route] {
				out = append(out, finding("catalog", SeverityError, "route "+m.Route+" is served twice"))
			}
			routes[m.Route] = true
			if m.Registered() {
				registered++
				if m.Invoke == nil {
					out = append(out, finding("catalog", SeverityError, m.FullName+" is registered without an implementation"))
				}
			}
		}
		return append(out, finding("catalog", SeverityInfo,
			fmt.Sprintf("%d methods in the catalog, %d registered", len(api.Methods), registered))), nil
	}}
}

// MigrationsCheck compares applied migrations with those of this build.
func MigrationsCheck(m Migrations) Check {
	return Check{Name: "migrations", Run: func(ctx context.Context, _ pgx.Tx) ([]api.Finding, error) {
		applied, known, err := m.MigrationStatus(ctx)
		if err != nil {
			return nil, err
		}
		isKnown := map[int64]bool{}
		for _, v := range known {
			isKnown[v] = true
		}
		isApplied := map[int64]bool{}
		var out []api.Finding
		for _, v := range applied {
			isApplied[v] = true
			if !isKnown[v] {
				out = append(out, finding("migrations", SeverityError, fmt.Sprintf("migration %d is applied but unknown to this build", v)))
			}
		}
		for _, v := range known {
			if !isApplied[v] {
				out = append(out, finding("migrations", SeverityError, fmt.Sprintf("migration %d is not applied", v)))
			}
		}
		if len(out) == 0 {
			out = append(out, finding("migrations", SeverityInfo, fmt.Sprintf("%d migrations applied", len(applied))))
		}
		return out, nil
	}}
}

// ExtensionCheck verifies that btree_gist, which range exclusion needs, is installed.
func ExtensionCheck() Check {
	return Check{Name: "btree_gist", Run: func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error) {
		ok, err := db.New(tx).ExtensionInstalled(ctx, "btree_gist")
		if err != nil {
			return nil, err
		}
		if !ok {
			return []api.Finding{finding("btree_gist", SeverityError, "the btree_gist extension is not installed")}, nil
		}
		return []api.Finding{finding("btree_gist", SeverityInfo, "btree_gist is installed")}, nil
	}}
}

// ClockCheck compares this process's clock with the database's.
func ClockCheck(now func() time.Time) Check {
	return Check{Name: "clock", Run: func(ctx context.Context, tx pgx.Tx) ([]api.Finding, error) {
		before := now()
		dbNow, err := db.New(tx).DatabaseNow(ctx)
		if err != nil {
			return nil, err
		}
		after := now()
		// Compare with the middle of the round trip.
		local := before.Add(after.Sub(before) / 2)
		skew := dbNow.Sub(local)
		if skew < 0 {
			skew = -skew
		}
		sev := SeverityInfo
		switch {
		case skew > SkewError:
			sev = SeverityError
		case skew > SkewWarning:
			sev = SeverityWarning
		}
		return []api.Finding{finding("clock", sev, fmt.Sprintf("database clock differs by %s", skew.Round(time.Millisecond)))}, nil
	}}
}
