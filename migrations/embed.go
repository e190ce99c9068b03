// Package migrations holds the numbered SQL migrations of the store, in
// goose format, embedded in the binary. internal/store runs them.
package migrations

import "embed"

// FS holds every migration file (NNNNN_name.sql).
//
//go:embed *.sql
var FS embed.FS
