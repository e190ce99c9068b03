package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ogen-go/ogen/ogenerrors"

	"computeplane/computeclient"
	"computeplane/internal/buildinfo"
)

// Environment variables and defaults.
const (
	EnvURL      = "SERVICE_URL"       // origin of the service
	EnvBasePath = "SERVICE_BASE_PATH" // API base path
	EnvToken    = "SERVICE_TOKEN"     // bearer credential
	EnvTenant   = "SERVICE_TENANT"    // default tenantId

	DefaultURL      = "http://localhost:3000"
	DefaultBasePath = "/api/compute"
	DefaultTimeout  = 60 * time.Second // keep the help of --timeout in step
)

// Program is the command's name in messages and help.
const Program = "computectl"

// Global flags.
const (
	flagURL      = "url"
	flagBasePath = "base-path"
	flagToken    = "token"
	flagOutput   = "output"
	flagInput    = "input"
	flagTimeout  = "timeout"
	flagProfile  = "profile"
	// flagQuiet and flagVersion take no value.
	flagQuiet   = "q"
	flagVersion = "version"
	// GlobalPrefix spells every global flag so that no method input can
	// shadow it: --cp-url is always the service's URL, even after
	// "webhooks create", whose --url is the webhook's.
	GlobalPrefix = "cp-"
)

// globalFlags take a value each; --help (-h) is the one flag without.
var globalFlags = []struct{ name, arg, help string }{
	{flagURL, "URL", "origin of the service (default $" + EnvURL + ", else " + DefaultURL + ")"},
	{flagBasePath, "PATH", "API base path (default $" + EnvBasePath + ", else " + DefaultBasePath + ")"},
	{flagToken, "TOKEN", "bearer credential (default $" + EnvToken + ")"},
	{flagOutput, "FORMAT", "table or json (default table)"},
	{flagInput, "FILE", "JSON object used as the whole input; - reads stdin; flags override its fields"},
	{flagTimeout, "DURATION", "give up after this long, e.g. 10s; 0 waits forever (default 60s)"},
	{flagProfile, "NAME", "saved connection to use (computectl login; default $" + EnvProfile + ", else the current one)"},
	{flagQuiet, "", "print only the ids of what is answered, one per line"},
	{flagVersion, "", "print computectl's version and exit"},
}

// globalName is the global flag name is, with or without GlobalPrefix.
func globalName(name string) (string, bool) {
	name = strings.TrimPrefix(name, GlobalPrefix)
	for _, g := range globalFlags {
		if g.name == name {
			return name, true
		}
	}
	return "", false
}

func isGlobal(name string) bool {
	_, ok := globalName(name)
	return ok
}

// takesNoValue reports the global flags that are switches.
func takesNoValue(name string) bool { return name == flagQuiet || name == flagVersion }

// Streams are a run's standard streams.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// StdinTTY and StderrTTY say the streams are terminals (IsTerminal):
	// a wait shows its state changes on stderr; a bare login prompts.
	StdinTTY, StderrTTY bool
}

// Run runs computectl with args (without the program name) over the
// commands of groups and returns the exit code. getenv reads the
// environment (SERVICE_URL, SERVICE_BASE_PATH, SERVICE_TOKEN,
// SERVICE_TENANT).
func Run(ctx context.Context, groups []Group, args []string, getenv func(string) string, s Streams) int {
	if code, ok := runTerminalCommand(ctx, groups, args, getenv, s); ok {
		return code // ssh (ssh.go)
	}
	inv, err := parse(groups, args)
	if err != nil {
		fmt.Fprintf(s.Stderr, "error: %v\n", err)
		fmt.Fprintf(s.Stderr, "Run '%s' for usage.\n", inv.helpCommand())
		return ExitUsage
	}
	switch {
	case inv.version:
		fmt.Fprintf(s.Stdout, "%s %s\n", Program, buildinfo.Version())
		return ExitOK
	case inv.login && inv.help:
		writeLoginHelp(s.Stdout)
		return ExitOK
	case inv.login:
		code, err := login(ctx, inv, getenv, s)
		if err != nil {
			fmt.Fprintf(s.Stderr, "error: %v\n", err)
			var ue *UsageError
			if errors.As(err, &ue) {
				return ExitUsage
			}
			return ExitError
		}
		return code
	case inv.tunnel != "":
		code, err := runTunnel(ctx, inv, getenv, s)
		if err != nil {
			fmt.Fprintf(s.Stderr, "error: %v\n", err)
			var ue *UsageError
			if errors.As(err, &ue) {
				fmt.Fprintf(s.Stderr, "Run '%s %s --help' for usage.\n", Program, inv.tunnel)
				return ExitUsage
			}
			return ExitError
		}
		return code
	case inv.help:
		inv.writeHelp(s.Stdout, groups)
		return ExitOK
	case inv.group == nil:
		writeMainHelp(s.Stderr, groups)
		return ExitUsage
	case inv.method == nil:
		writeGroupHelp(s.Stderr, inv.group)
		return ExitUsage
	}
	call := inv.call
	if isBuiltin(inv.method) {
		call = inv.runBuiltin
	}
	code, err := call(ctx, getenv, s)
	if err != nil {
		var ue *UsageError
		if errors.As(err, &ue) {
			fmt.Fprintf(s.Stderr, "error: %v\n", err)
			fmt.Fprintf(s.Stderr, "Run '%s' for usage.\n", inv.helpCommand())
			return ExitUsage
		}
		fmt.Fprintf(s.Stderr, "error: %v\n", err)
		return ExitError
	}
	return code
}

// invocation is a parsed command line.
type invocation struct {
	group   *Group
	method  *Method
	help    bool
	version bool
	login   bool   // computectl login: save a profile
	tunnel  string // a tunnel command (tunnel.go): its arguments are rest
	global  map[string]string
	flags   []FlagValue
	rest    []string // the arguments after --: sandboxes exec's argv
}

// parse reads the command line: global flags anywhere; the group; the
// method; then the method's flags. After the method name a method flag
// wins over a global flag of the same name (webhooks create --url is the
// webhook's URL), so such a global flag must come before the group.
// Flags are --name value, --name=value, and a bool flag alone is true;
// one dash works as well as two.
func parse(groups []Group, args []string) (*invocation, error) {
	inv := &invocation{global: map[string]string{}}
	helpCmd := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' {
			switch {
			case inv.group == nil && !helpCmd && a == "help" && i == firstPositional(args):
				helpCmd, inv.help = true, true
			case inv.group == nil && !inv.login && a == "login" && i == firstPositional(args):
				inv.login = true
			case inv.group == nil && !inv.login && !helpCmd && isTunnelCommand(a) && i == firstPositional(args):
				// Its own arguments: parsed by runTunnel.
				inv.tunnel, inv.rest = a, args[i+1:]
				return inv, nil
			case inv.group == nil && !inv.login:
				if inv.group = findGroup(groups, a); inv.group == nil {
					if near := suggest(a, groupNames(groups)); near != "" {
						return inv, usagef("unknown group %q; did you mean %s?", a, near)
					}
					return inv, usagef("unknown group %q", a)
				}
			case inv.method == nil && !inv.login:
				if inv.method = inv.group.method(a); inv.method == nil {
					inv.method = builtin(inv.group, a)
				} else {
					inv.method = withLocalFlags(inv.group, inv.method)
				}
				if inv.method == nil {
					if near := suggest(a, methodNames(inv.group)); near != "" {
						return inv, usagef("unknown command %q of group %s; did you mean %s %s?", a, inv.group.Name, inv.group.Name, near)
					}
					return inv, usagef("unknown command %q of group %s", a, inv.group.Name)
				}
			default:
				return inv, usagef("unexpected argument %q", a)
			}
			continue
		}
		if a == "--" && inv.method != nil {
			inv.rest = args[i+1:]
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if name == "h" || name == "help" {
			inv.help = true
			continue
		}
		var f *Flag
		if inv.method != nil && !strings.HasPrefix(name, GlobalPrefix) {
			f = inv.method.flagNamed(name)
		}
		if g, ok := globalName(name); f == nil && ok && takesNoValue(g) {
			if g == flagVersion {
				inv.version = true
			}
			inv.global[g] = "true"
			continue
		}
		if f == nil && !isGlobal(name) {
			if inv.method == nil && inv.group != nil {
				return inv, usagef("unknown flag %s (a command's flags come after its name)", a)
			}
			return inv, usagef("unknown flag %s", a)
		}
		if !hasValue {
			switch {
			case f != nil && f.Type == Bool:
				value = "true"
			case f != nil && f.Type == Wait && (i+1 >= len(args) || !isWaitValue(args[i+1])):
				value = DefaultWait.String() // --wait alone
			default:
				if i+1 >= len(args) {
					return inv, usagef("flag --%s needs a value", name)
				}
				i++
				value = args[i]
			}
		}
		if f != nil {
			inv.flags = append(inv.flags, FlagValue{Name: name, Value: value})
		} else {
			g, _ := globalName(name)
			inv.global[g] = value
		}
	}
	return inv, nil
}

// firstPositional is the index of the first argument that is not a flag
// or a global flag's value.
func firstPositional(args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' {
			return i
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if g, ok := globalName(name); !hasValue && ok && !takesNoValue(g) {
			i++
		}
	}
	return -1
}

func (inv *invocation) helpCommand() string {
	switch {
	case inv.method != nil:
		return fmt.Sprintf("%s %s %s --help", Program, inv.group.Name, inv.method.Name)
	case inv.group != nil:
		return fmt.Sprintf("%s %s --help", Program, inv.group.Name)
	}
	return Program + " --help"
}

func (inv *invocation) writeHelp(w io.Writer, groups []Group) {
	switch {
	case inv.method != nil:
		writeMethodHelp(w, inv.group, inv.method)
	case inv.group != nil:
		writeGroupHelp(w, inv.group)
	default:
		writeMainHelp(w, groups)
	}
}

// settings are the resolved global flags and environment.
type settings struct {
	origin  string
	apiURL  string
	token   string
	tenant  string
	output  string
	timeout time.Duration
}

func (inv *invocation) settings(getenv func(string) string) (*settings, error) {
	prof, err := inv.profile(getenv)
	if err != nil {
		return nil, err
	}
	if prof == nil {
		prof = &Profile{}
	}
	pick := func(flag, env, saved, def string) string {
		if v, ok := inv.global[flag]; ok {
			return v
		}
		if env != "" {
			if v := getenv(env); v != "" {
				return v
			}
		}
		if saved != "" {
			return saved
		}
		return def
	}
	s := &settings{
		token:  pick(flagToken, EnvToken, prof.Token, ""),
		tenant: pick("", EnvTenant, prof.Tenant, ""),
		output: pick(flagOutput, "", "", OutputTable),
	}
	if s.output != OutputTable && s.output != OutputJSON {
		return nil, usagef("--output must be table or json, not %q", s.output)
	}
	origin := pick(flagURL, EnvURL, prof.URL, DefaultURL)
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("the service URL %q is not an http or https URL", origin)
	}
	base := strings.TrimRight(pick(flagBasePath, EnvBasePath, "", DefaultBasePath), "/")
	if base != "" && !strings.HasPrefix(base, "/") {
		base = "/" + base
	}
	s.origin = strings.TrimRight(origin, "/")
	s.apiURL = s.origin + base
	s.timeout = DefaultTimeout
	if v, ok := inv.global[flagTimeout]; ok {
		if s.timeout, err = time.ParseDuration(v); err != nil || s.timeout < 0 {
			return nil, usagef("--timeout must be a duration such as 30s, not %q", v)
		}
	}
	return s, nil
}

// call sends the method's input and prints the answer; it returns the exit
// code, or an error the answer never got to (UsageError: exit 2).
func (inv *invocation) call(ctx context.Context, getenv func(string) string, s Streams) (int, error) {
	set, err := inv.settings(getenv)
	if err != nil {
		return 0, err
	}
	var input []byte
	if path, ok := inv.global[flagInput]; ok {
		if input, err = readInput(path, s.Stdin); err != nil {
			return 0, err
		}
	}
	if set.tenant == "" && set.token != "" && inv.method.Flag(TenantField) != nil && !hasField(inv.method, input, inv.flags, TenantField) {
		// No tenant given: the credential's own.
		if set.tenant, err = whoamiTenant(ctx, set); err != nil {
			return 0, err
		}
	}
	flags := inv.flags
	if f := inv.method.Flag(IdempotencyField); f != nil && f.Required && !hasField(inv.method, input, flags, IdempotencyField) &&
		onlyMissing(inv.method, input, flags, set.tenant, IdempotencyField) {
		key := newIdempotencyKey()
		fmt.Fprintf(s.Stderr, "idempotency key: %s (pass --%s %s to retry this call safely)\n", key, f.Name, key)
		flags = append(slices.Clone(flags), FlagValue{Name: f.Name, Value: key})
	}
	if flags, err = inv.localInput(flags, s); err != nil {
		return 0, err
	}
	body, err := BuildInput(inv.method, set.tenant, input, flags)
	if err != nil {
		return 0, err
	}
	c, err := computeclient.New(set.apiURL,
		computeclient.WithToken(set.token),
		computeclient.WithHTTPClient(&http.Client{Transport: exchangeTransport{base: http.DefaultTransport}}))
	if err != nil {
		return 0, err
	}
	if set.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, set.timeout)
		defer cancel()
	}
	// failed prints an error the call ended with and returns its exit code.
	failed := func(x *exchange, err error) (int, error) {
		if e, ok := computeclient.AsError(err); ok {
			if set.output == OutputJSON {
				writeAPIErrorJSON(s.Stderr, e, x.requestID)
			} else {
				writeAPIError(s.Stderr, e)
				if x.requestID != "" {
					fmt.Fprintf(s.Stderr, "  requestId: %s\n", x.requestID)
				}
			}
			return ExitCode(e.Code), nil
		}
		if errors.Is(err, ogenerrors.ErrSecurityRequirementIsNotSatisfied) {
			// The generated client sends no call that needs a credential
			// without one: the server would answer UNAUTHENTICATED.
			fmt.Fprintf(s.Stderr, "error: no credential: %s %s needs one; set %s or --token\n",
				inv.group.Name, inv.method.Name, EnvToken)
			return ExitAccess, nil
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return 0, fmt.Errorf("no answer within --timeout %s", set.timeout)
		}
		return 0, err
	}
	wait := waitGiven(inv.method, body)
	var prog *progress
	if wait && s.StderrTTY {
		// On a terminal a wait shows the state changes as they come: get
		// is read while the waiting call is out.
		prog = &progress{w: s.Stderr, start: time.Now()}
		id := bodyString(body, inv.method.IDField)
		if key := bodyString(body, IdempotencyField); id == "" && key != "" {
			// A create: a first call without wait names the object; the
			// same call again (the same key: the same object, no second
			// decision) waits.
			first := &exchange{body: withBody(body, firstOfType(inv.method, Wait).Field, nil)}
			if err := inv.method.Call(withExchange(ctx, first), c); err != nil {
				return failed(first, err)
			}
			if data, err := first.data(); err == nil {
				var state string
				state, _, id = stateOf(inv.method, data)
				prog.show(inv.group.Name, id, state)
			}
		}
		if id != "" {
			pctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); prog.follow(pctx, c, inv.group, set.tenant, id) }()
			defer func() { stop(); <-done }()
		}
	}
	x := &exchange{body: body}
	if err := inv.method.Call(withExchange(ctx, x), c); err != nil {
		return failed(x, err)
	}
	data, err := x.data()
	if err != nil {
		return 0, err
	}
	if code, ok, err := inv.rawOutput(set, data, s); ok {
		return code, err
	}
	if inv.global[flagQuiet] == "true" {
		if err := writeIDs(s.Stdout, data, inv.method.IDField); err != nil {
			return 0, err
		}
	} else if err := WriteOutput(s.Stdout, set.output, data); err != nil {
		return 0, fmt.Errorf("print the answer: %w", err)
	}
	if wait {
		state, reason, id := stateOf(inv.method, data)
		if prog != nil {
			prog.show(inv.group.Name, id, state)
		}
		if state == StateFailed {
			if reason == "" {
				reason = "no reason given"
			}
			fmt.Fprintf(s.Stderr, "error: %s %s failed: %s\n", inv.group.Name, id, reason)
			return ExitFailed, nil
		}
	}
	return ExitOK, nil
}

// bodyString is a string field of a JSON object body, "" when absent.
func bodyString(body []byte, field string) string {
	if field == "" {
		return ""
	}
	var obj map[string]any
	_ = json.Unmarshal(body, &obj)
	v, _ := obj[field].(string)
	return v
}

// readInput reads --input: a file, or stdin for "-".
func readInput(path string, stdin io.Reader) ([]byte, error) {
	if path == "-" {
		if stdin == nil {
			return nil, usagef("--input -: no standard input")
		}
		data, err := io.ReadAll(stdin)
		if err != nil {
			return nil, usagef("--input -: %v", err)
		}
		return data, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--input: %v", err)
	}
	return data, nil
}
