package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
)

// Sandboxes' exec, readFile and writeFile work like kubectl exec and cp:
// the command's output goes raw to stdout and stderr and its exit code is
// computectl's; files are read from and written to local files or the
// standard streams. Base64 is the wire's only.

// ExitTimedOut is the exit code of an exec whose command ran out of
// timeoutMs, as timeout(1) has it.
const ExitTimedOut = 124

// localFlags are computectl's own flags of generated commands.
var localFlags = map[string][]Flag{
	"sandboxes/writeFile": {{Name: "from", Field: "from", Type: String, Local: true,
		Help: "local file whose bytes are written; - reads stdin (instead of --content-base64)"}},
	"sandboxes/readFile": {{Name: "to", Field: "to", Type: String, Local: true,
		Help: "local file the bytes are written to (default: stdout, raw)"}},
	"supportBundles/get": {{Name: "to", Field: "to", Type: String, Local: true,
		Help: "download the ready bundle (a .tar.gz) to this local file, - for stdout, instead of printing the answer"}},
}

// withLocalFlags is m with computectl's own flags, when it has any.
func withLocalFlags(g *Group, m *Method) *Method {
	extra := localFlags[g.Name+"/"+m.Name]
	if len(extra) == 0 {
		return m
	}
	c := *m
	c.Flags = append(slices.Clone(m.Flags), extra...)
	for i := range c.Flags {
		if c.Flags[i].Field == "contentBase64" {
			c.Flags[i].Required = false // --from gives it
		}
	}
	return &c
}

func (inv *invocation) is(group, method string) bool {
	return inv.group != nil && inv.method != nil && inv.group.Name == group && inv.method.Name == method
}

func (inv *invocation) local(name string) (string, bool) {
	v, ok := "", false
	for _, fv := range inv.flags {
		if fv.Name == name {
			v, ok = fv.Value, true
		}
	}
	return v, ok
}

// localInput turns computectl's own flags and the arguments after -- into
// input flags: exec's argv, writeFile's content.
func (inv *invocation) localInput(flags []FlagValue, s Streams) ([]FlagValue, error) {
	if len(inv.rest) > 0 {
		if !inv.is("sandboxes", "exec") && !inv.is("sandboxes", "startProcess") {
			return nil, usagef("unexpected arguments after --: %q", inv.rest)
		}
		flags = append(slices.Clone(flags), FlagValue{Name: "argv", Value: string(mustJSON(inv.rest))})
	}
	if from, ok := inv.local("from"); ok && inv.is("sandboxes", "writeFile") {
		var data []byte
		var err error
		if from == "-" {
			if s.Stdin == nil {
				return nil, usagef("--from -: no standard input")
			}
			data, err = io.ReadAll(s.Stdin)
		} else {
			data, err = os.ReadFile(from)
		}
		if err != nil {
			return nil, usagef("--from: %v", err)
		}
		flags = append(slices.Clone(flags), FlagValue{Name: "content-base64", Value: base64.StdEncoding.EncodeToString(data)})
	} else if inv.is("sandboxes", "writeFile") && !hasField(inv.method, nil, flags, "contentBase64") && inv.global[flagInput] == "" {
		return nil, usagef("missing --from FILE (- for stdin) or --content-base64")
	}
	return flags, nil
}

// rawOutput prints the answers of exec and readFile raw, unless --output
// json asks for the API's answer; ok is false for every other command.
func (inv *invocation) rawOutput(set *settings, data []byte, s Streams) (code int, ok bool, err error) {
	if _, asked := inv.global[flagOutput]; asked && set.output == OutputJSON {
		if inv.is("sandboxes", "exec") {
			// The JSON answer, and still the command's exit code.
			var r struct{ ExitCode int }
			_ = json.Unmarshal(data, &r)
			return execExit(r.ExitCode, false), true, WriteOutput(s.Stdout, OutputJSON, data)
		}
		return 0, false, nil
	}
	switch {
	case inv.is("sandboxes", "exec"):
		var r struct {
			ExitCode       int
			Stdout, Stderr string
			Truncated      bool
			TimedOut       bool
			DurationMs     int64
		}
		if err := json.Unmarshal(data, &r); err != nil {
			return 0, true, err
		}
		_, _ = io.WriteString(s.Stdout, r.Stdout)
		_, _ = io.WriteString(s.Stderr, r.Stderr)
		if r.Truncated {
			fmt.Fprintln(s.Stderr, "computectl: the output was cut at 1 MiB")
		}
		if r.TimedOut {
			fmt.Fprintf(s.Stderr, "computectl: the command timed out after %d ms\n", r.DurationMs)
		}
		return execExit(r.ExitCode, r.TimedOut), true, nil
	case inv.is("supportBundles", "get"):
		to, ok := inv.local("to")
		if !ok {
			return 0, false, nil
		}
		return fetchBundle(data, to, s)
	case inv.is("sandboxes", "readFile"):
		var r struct{ ContentBase64 []byte } // format byte: encoding/json decodes the base64
		if err := json.Unmarshal(data, &r); err != nil {
			return 0, true, fmt.Errorf("the answer's contentBase64: %w", err)
		}
		content := r.ContentBase64
		if to, ok := inv.local("to"); ok && to != "-" {
			return ExitOK, true, os.WriteFile(to, content, 0o644)
		}
		_, err = s.Stdout.Write(content)
		return ExitOK, true, err
	}
	return 0, false, nil
}

// execExit is computectl's exit code for a command's: its own, 124 when it
// timed out (or was killed), 255 past the range of exit codes.
func execExit(code int, timedOut bool) int {
	switch {
	case timedOut || code < 0:
		return ExitTimedOut
	case code > 255:
		return 255
	}
	return code
}
