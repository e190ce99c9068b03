package events

import (
	"strconv"
	"strings"

	"computeplane/gen/api"
)

// MaxPatterns is how many type patterns one reader may give (the
// specification's 1 to 20 webhook patterns; events.list and /watch take the
// same).
const MaxPatterns = 20

// Matcher selects event types by the patterns of the specification: an
// exact type, a family such as site.* (every type below site.), or *. The
// zero Matcher matches every type.
type Matcher struct {
	some     bool // false: every type
	exact    map[string]bool
	families []string // "site." for site.*
}

// Match reports whether typ is selected.
func (m Matcher) Match(typ string) bool {
	if !m.some {
		return true
	}
	if m.exact[typ] {
		return true
	}
	for _, f := range m.families {
		if strings.HasPrefix(typ, f) {
			return true
		}
	}
	return false
}

// All reports whether every type is selected.
func (m Matcher) All() bool { return !m.some }

// ParsePatterns compiles patterns; none means every type. A pattern that
// matches no type of the event catalog (api.EventTypes) is INVALID_INPUT
// naming it, as the specification's webhooks rule 1 says of patterns.
// Syntax (lower-case dotted names) is checked by the generated decoder; a
// malformed pattern also matches nothing and is refused here too.
func ParsePatterns(patterns []string) (Matcher, error) {
	if len(patterns) > MaxPatterns {
		return Matcher{}, api.Errorf(api.CodeInvalidInput, "types: at most %d patterns, got %d", MaxPatterns, len(patterns))
	}
	m := Matcher{}
	for i, p := range patterns {
		switch {
		case p == "*":
			return Matcher{}, nil
		case strings.HasSuffix(p, ".*"):
			family := strings.TrimSuffix(p, "*")
			if strings.Contains(family, "*") || !anyType(func(t string) bool { return strings.HasPrefix(t, family) }) {
				return Matcher{}, noMatch(i, p)
			}
			m.families = append(m.families, family)
		default:
			if !anyType(func(t string) bool { return t == p }) {
				return Matcher{}, noMatch(i, p)
			}
			if m.exact == nil {
				m.exact = map[string]bool{}
			}
			m.exact[p] = true
		}
		m.some = true
	}
	return m, nil
}

func anyType(ok func(string) bool) bool {
	for _, e := range api.EventTypes {
		if ok(e.Type) {
			return true
		}
	}
	return false
}

func noMatch(i int, p string) error {
	return api.Errorf(api.CodeInvalidInput, "types[%d]: pattern %q matches no type of the event catalog", i, p).
		WithDetails(map[string]any{"path": "types[" + strconv.Itoa(i) + "]"})
}
