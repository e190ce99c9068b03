package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"computeplane/computeclient"
)

// Exit codes of computectl, by error class.
const (
	ExitOK           = 0 // success
	ExitError        = 1 // internal, unknown or network error
	ExitUsage        = 2 // bad flags, arguments or local JSON; nothing was sent
	ExitInvalidInput = 3 // INVALID_INPUT
	ExitAccess       = 4 // refused: credential, permission, confirmation, CSRF, origin
	ExitNotFound     = 5 // NOT_FOUND
	ExitState        = 6 // conflicts with the current state
	ExitRetryable    = 7 // retry later
	ExitUnsupported  = 8 // not implemented or not supported
	ExitFailed       = 9 // the work waited for (--wait) ended failed
)

// ExitClass is one exit code and the error codes that map to it.
type ExitClass struct {
	Exit    int
	Meaning string
	Codes   []string // API error codes; none for 0, 1 and 2
}

// ExitClasses lists every exit code: computectl --help and docs/cli.md show
// this table, ExitCode applies it.
var ExitClasses = []ExitClass{
	{ExitOK, "success", nil},
	{ExitError, "internal, unknown or network error, no answer (INTERNAL_ERROR, INVALID_CONFIG, DRIVER_ERROR, PROVIDER_ERROR, METHOD_NOT_ALLOWED, any other code)", nil},
	{ExitUsage, "usage: bad flags or arguments, --input not a JSON object, a required field missing; nothing was sent", nil},
	{ExitInvalidInput, "the server refused the input", []string{"INVALID_INPUT"}},
	{ExitAccess, "refused (also: no credential for a method that needs one)", []string{"UNAUTHENTICATED", "ACCESS_DENIED", "CONFIRMATION_REQUIRED", "CSRF_REJECTED", "UNTRUSTED_ORIGIN"}},
	{ExitNotFound, "not found", []string{"NOT_FOUND"}},
	{ExitState, "conflicts with the current state", []string{"CONFLICT", "INVALID_STATE", "QUOTA_EXCEEDED", "CAPACITY_UNAVAILABLE", "CONFIG_DRIFT"}},
	{ExitRetryable, "retryable (try again later)", []string{"RATE_LIMITED", "UNAVAILABLE"}},
	{ExitUnsupported, "not served by this deployment", []string{"NOT_IMPLEMENTED", "UNSUPPORTED"}},
	{ExitFailed, "--wait: the work waited for ended failed (its error on stderr)", nil},
}

// ExitCode is the exit code of an API error code: ExitError for codes no
// class names.
func ExitCode(code string) int {
	for _, c := range ExitClasses {
		if slices.Contains(c.Codes, code) {
			return c.Exit
		}
	}
	return ExitError
}

// writeAPIError prints an API error: "error: CODE (status): message", then
// one line per detail: each issue of INVALID_INPUT as "  path: message",
// any other detail as "  key: <JSON>", sorted by key.
func writeAPIError(w io.Writer, e *computeclient.Error) {
	fmt.Fprintf(w, "error: %s (%d): %s\n", e.Code, e.Status, e.Message)
	if e.RetryAfterMs != nil {
		fmt.Fprintf(w, "  retryAfterMs: %d\n", *e.RetryAfterMs)
	}
	keys := make([]string, 0, len(e.Details))
	for k := range e.Details {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k == "issues" {
			if issues, ok := issueLines(e); ok {
				for _, l := range issues {
					if l != e.Message { // the first problem is the message: printed once
						fmt.Fprintln(w, "  "+l)
					}
				}
				continue
			}
		}
		raw, err := json.Marshal(e.Details[k])
		if err != nil {
			raw = []byte(fmt.Sprint(e.Details[k]))
		}
		fmt.Fprintf(w, "  %s: %s\n", k, raw)
	}
}

// issueLines are the issues of details.issues as "path: message"; false
// when they do not have that form.
func issueLines(e *computeclient.Error) ([]string, bool) {
	list, ok := e.Details["issues"].([]any)
	if !ok {
		return nil, false
	}
	lines := make([]string, 0, len(list))
	for _, it := range list {
		m, ok := it.(map[string]any)
		if !ok {
			return nil, false
		}
		path, _ := m["path"].(string)
		msg, _ := m["message"].(string)
		if path == "" {
			path = "(input)"
		}
		lines = append(lines, path+": "+strings.TrimSpace(msg))
	}
	return lines, true
}
