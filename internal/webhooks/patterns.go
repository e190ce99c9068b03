package webhooks

import (
	"fmt"
	"slices"
	"strings"

	"computeplane/gen/api"
)

// Match reports whether the event type typ matches pattern: an exact type,
// a family such as "site.*" (every type starting "site."), or "*".
func Match(pattern, typ string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasSuffix(pattern, ".*"):
		return strings.HasPrefix(typ, pattern[:len(pattern)-1])
	default:
		return pattern == typ
	}
}

// MatchAny reports whether typ matches one of patterns.
func MatchAny(patterns []string, typ string) bool {
	for _, p := range patterns {
		if Match(p, typ) {
			return true
		}
	}
	return false
}

// checkPatterns is rule 1: every pattern must match a type of the catalog
// unless the deployment accepts any pattern. The input schema has already
// checked their syntax and count.
func (s *Service) checkPatterns(patterns []string) error {
	if s.opt.AcceptAnyPattern {
		return nil
	}
	for i, p := range patterns {
		matched := false
		for _, e := range s.types {
			if Match(p, e.Type) {
				matched = true
				break
			}
		}
		if !matched {
			path := fmt.Sprintf("events[%d]", i)
			return api.Errorf(api.CodeInvalidInput, "%s: pattern %q matches no event type of the catalog (see webhooks.eventTypes)", path, p).
				WithDetails(map[string]any{"path": path})
		}
	}
	return nil
}

// Served reports whether module is served in this deployment: a group of
// the registry with a registered method (the host refuses to start when a
// registered group has no implementation). Types of the catalog whose
// module is not served (reservation.*, say) are accepted as patterns, so a
// webhook can subscribe before the module ships, but cannot fire yet.
//
// A plugin's module is its id: its types are listed only when the plugin
// is configured (plugins.EventTypes), and then served.
func Served(module string) bool {
	return slices.ContainsFunc(api.Methods, func(m *api.Method) bool {
		return m.Registered() && ((m.Plugin == "" && m.Group == module) || m.Plugin == module)
	})
}
