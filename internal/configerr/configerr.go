// Package configerr is the form of a refused setting, INVALID_CONFIG
// naming the option: "INVALID_CONFIG: <option>: <reason>". It is a leaf
// (standard library only) so that the control plane's configuration
// (internal/config) and the node daemon's settings (compute-agent's
// flags, internal/agent/telemetry) share it without the daemon linking
// the server's packages.
package configerr

import (
	"errors"
	"strings"
)

// Error is an invalid setting: INVALID_CONFIG, naming the option (a
// configuration path such as cloud.issuers[0].jwksUrl, or a flag such as
// --telemetry-interval).
type Error struct {
	Option  string
	Message string
}

func (e *Error) Error() string {
	return "INVALID_CONFIG: " + e.Option + ": " + e.Message
}

// Errors is every problem of a configuration, in the order of the
// options. Join answers a single *Error when there is one problem and
// Errors when there are more; errors.As finds the first *Error of either.
type Errors []*Error

// Error is one problem a line.
func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, p := range e {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap gives each problem to errors.Is and errors.As.
func (e Errors) Unwrap() []error {
	out := make([]error, len(e))
	for i, p := range e {
		out[i] = p
	}
	return out
}

// Problems lists the problems of err: every one of an Errors, the one of
// an *Error, none otherwise.
func Problems(err error) []*Error {
	var many Errors
	if errors.As(err, &many) {
		return many
	}
	var one *Error
	if errors.As(err, &one) {
		return []*Error{one}
	}
	return nil
}

// Join is nil for no problem, the problem for one, Errors for more.
func Join(list []*Error) error {
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return Errors(list)
}
