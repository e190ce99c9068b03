package profiles

import (
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"time"
)

// BuiltinTenant owns the read-only profiles the service ships: embedded
// from builtin/, never stored, never deleted, visible to every tenant
// after its own and public ones.
const BuiltinTenant = "builtin"

// BuiltinTime is the createdAt, updatedAt and lockedAt of the shipped
// profiles: they are immutable, and their times do not move between
// releases or processes.
var BuiltinTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

//go:embed builtin/*.json
var builtinFS embed.FS

// builtin is one shipped profile version.
type builtin struct {
	doc map[string]any
	d   *Document
}

// builtins are the shipped profiles sorted by id and version.
var builtins = loadBuiltins()

func loadBuiltins() []builtin {
	names, err := builtinFS.ReadDir("builtin")
	if err != nil {
		panic(err)
	}
	var out []builtin
	for _, n := range names {
		raw, err := builtinFS.ReadFile(path.Join("builtin", n.Name()))
		if err != nil {
			panic(err)
		}
		d, issues := CheckJSON(raw)
		if len(issues) > 0 {
			panic(fmt.Sprintf("profiles: builtin/%s: %s: %s", n.Name(), issues[0].Path, issues[0].Message))
		}
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			panic(err)
		}
		out = append(out, builtin{doc: doc, d: d})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].d.ID != out[j].d.ID {
			return out[i].d.ID < out[j].d.ID
		}
		return out[i].d.Version < out[j].d.Version
	})
	for i := 1; i < len(out); i++ {
		if out[i].d.ID == out[i-1].d.ID && out[i].d.Version == out[i-1].d.Version {
			panic(fmt.Sprintf("profiles: builtin %s@%d is shipped twice", out[i].d.ID, out[i].d.Version))
		}
	}
	return out
}

// findBuiltin returns the shipped version (the latest for 0).
func findBuiltin(id string, version int) *builtin {
	var found *builtin
	for i := range builtins {
		b := &builtins[i]
		if b.d.ID == id && (version == 0 || b.d.Version == version) {
			found = b
		}
	}
	return found
}
