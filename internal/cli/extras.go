package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"computeplane/computeclient"
	"computeplane/gen/client"
)

// Profiles: `computectl login` keeps named connections (URL, token, tenant)
// in the user's config directory; --profile (or the current profile)
// supplies what neither a flag nor the environment gives.

// Environment of the profiles.
const (
	// EnvProfile names the profile to use when --profile is not given.
	EnvProfile = "COMPUTECTL_PROFILE"
	// EnvConfig is the path of the profiles file, instead of ConfigPath's.
	EnvConfig = "COMPUTECTL_CONFIG"
)

// Profile is one saved connection.
type Profile struct {
	URL    string `json:"url"`
	Token  string `json:"token"`
	Tenant string `json:"tenant,omitempty"`
}

// profileFile is the saved profiles and the current one.
type profileFile struct {
	Current  string             `json:"current"`
	Profiles map[string]Profile `json:"profiles"`
}

// ConfigPath is where the profiles are kept; a variable so tests can move it.
var ConfigPath = func() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "computectl", "config.json"), nil
}

func configPath(getenv func(string) string) (string, error) {
	if p := getenv(EnvConfig); p != "" {
		return p, nil
	}
	return ConfigPath()
}

func loadProfiles(getenv func(string) string) (*profileFile, error) {
	p, err := configPath(getenv)
	if err != nil {
		return nil, err
	}
	pf := &profileFile{Profiles: map[string]Profile{}}
	raw, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return pf, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, pf); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if pf.Profiles == nil {
		pf.Profiles = map[string]Profile{}
	}
	return pf, nil
}

func saveProfiles(getenv func(string) string, pf *profileFile) error {
	p, err := configPath(getenv)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(pf, "", "  ")
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(raw, '\n'), 0o600); err != nil { // it holds tokens
		return err
	}
	return os.Rename(tmp, p)
}

// profile is the profile a run uses: --profile, else $COMPUTECTL_PROFILE,
// else the current one; nil when there is none.
func (inv *invocation) profile(getenv func(string) string) (*Profile, error) {
	name := inv.global[flagProfile]
	if name == "" {
		name = getenv(EnvProfile)
	}
	pf, err := loadProfiles(getenv)
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = pf.Current
	}
	if name == "" {
		return nil, nil
	}
	p, ok := pf.Profiles[name]
	if !ok {
		return nil, usagef("no profile %q (computectl login --profile %s ...)", name, name)
	}
	return &p, nil
}

// login checks the credential with system.whoami and saves it as a profile,
// the tenant taken from the key when not given; the profile becomes the
// current one.
func login(ctx context.Context, inv *invocation, getenv func(string) string, s Streams) (int, error) {
	if len(inv.global) == 0 {
		// A bare login: the user types what to save, or nothing is saved
		// (not the environment's token, silently, as the default).
		if !s.StdinTTY {
			return 0, usagef("login needs --token TOKEN (and --url URL): the standard input is not a terminal to ask on; see '%s login --help'", Program)
		}
		if err := promptLogin(inv, getenv, s); err != nil {
			return 0, err
		}
	}
	// The profile named is the one being saved, not one to read.
	name := inv.global[flagProfile]
	delete(inv.global, flagProfile)
	set, err := inv.settings(func(k string) string {
		if k == EnvProfile {
			return ""
		}
		return getenv(k)
	})
	if err != nil {
		return 0, err
	}
	if set.token == "" {
		return 0, usagef("login needs a credential: --token or $%s", EnvToken)
	}
	if name == "" {
		name = "default"
	}
	tenant, err := whoamiTenant(ctx, set)
	if err != nil {
		return 0, err
	}
	if set.tenant != "" {
		tenant = set.tenant
	}
	pf, err := loadProfiles(getenv)
	if err != nil {
		return 0, err
	}
	pf.Profiles[name] = Profile{URL: set.origin, Token: set.token, Tenant: tenant}
	pf.Current = name
	if err := saveProfiles(getenv, pf); err != nil {
		return 0, err
	}
	path, _ := configPath(getenv)
	fmt.Fprintf(s.Stdout, "logged in to %s as tenant %s; profile %s saved in %s\n", set.origin, tenant, name, path)
	return ExitOK, nil
}

// promptLogin asks on the terminal for the service's URL and the token
// (not echoed).
func promptLogin(inv *invocation, getenv func(string) string, s Streams) error {
	in := bufio.NewReader(s.Stdin)
	def := getenv(EnvURL)
	if def == "" {
		def = DefaultURL
	}
	fmt.Fprintf(s.Stderr, "Service URL [%s]: ", def)
	u, err := in.ReadString('\n')
	if err != nil {
		return usagef("login: %v", err)
	}
	if u = strings.TrimSpace(u); u == "" {
		u = def
	}
	fmt.Fprint(s.Stderr, "API key (not shown): ")
	restore := noEcho(s.Stdin)
	tok, err := in.ReadString('\n')
	restore()
	fmt.Fprintln(s.Stderr)
	if err != nil || strings.TrimSpace(tok) == "" {
		return usagef("login: no API key given")
	}
	inv.global[flagURL], inv.global[flagToken] = u, strings.TrimSpace(tok)
	return nil
}

// noEcho turns the terminal's echo off until the returned func is called.
func noEcho(r io.Reader) func() {
	f, ok := r.(*os.File)
	if !ok {
		return func() {}
	}
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return func() {}
	}
	quiet := *old
	quiet.Lflag &^= unix.ECHO
	_ = unix.IoctlSetTermios(fd, unix.TCSETS, &quiet)
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }
}

// whoamiTenant asks the service whose credential this is.
func whoamiTenant(ctx context.Context, set *settings) (string, error) {
	c, err := computeclient.New(set.apiURL, computeclient.WithToken(set.token))
	if err != nil {
		return "", err
	}
	res, err := c.SystemWhoami(ctx, &client.SystemWhoamiInput{})
	if err != nil {
		return "", fmt.Errorf("system.whoami: %w", err)
	}
	if !res.Data.Authenticated {
		return "", errors.New("the credential is not valid: system.whoami answers authenticated false")
	}
	return res.Data.TenantId.Or(""), nil
}

// IdempotencyField is the input field of a retryable create's key.
const IdempotencyField = "idempotencyKey"

// newIdempotencyKey is a key for a call that needs one and got none.
func newIdempotencyKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "cli-" + hex.EncodeToString(b[:])
}

// hasField reports whether --input or a flag gives field.
func hasField(m *Method, input []byte, flags []FlagValue, field string) bool {
	for _, fv := range flags {
		if f := m.flagNamed(fv.Name); f != nil && f.Field == field {
			return true
		}
	}
	if input != nil {
		obj, err := parseObject(input)
		if err == nil {
			_, ok := obj[field]
			return ok
		}
	}
	return false
}

// onlyMissing reports whether field is the one required field the call
// lacks: a key is made up only for a call that would then be complete.
func onlyMissing(m *Method, input []byte, flags []FlagValue, tenant, field string) bool {
	for _, f := range m.Flags {
		if !f.Required || f.Field == field || (f.Field == TenantField && tenant != "") {
			continue
		}
		if !hasField(m, input, flags, f.Field) {
			return false
		}
	}
	return true
}

// suggest is the name among names nearest to given, "" when none is near.
func suggest(given string, names []string) string {
	best, bestD := "", len(given)/2+2
	for _, n := range names {
		if d := distance(strings.ToLower(given), strings.ToLower(n)); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func groupNames(groups []Group) []string {
	out := make([]string, 0, len(groups))
	for _, g := range groups {
		out = append(out, g.Name)
	}
	return out
}

func methodNames(g *Group) []string {
	out := make([]string, 0, len(g.Methods)+1)
	for _, m := range g.Methods {
		out = append(out, m.Name)
	}
	for _, name := range []string{"tail", "listen"} {
		if builtin(g, name) != nil {
			out = append(out, name)
		}
	}
	return out
}

// writeAPIErrorJSON writes an API error as one JSON object, with the
// request id, for --output json.
func writeAPIErrorJSON(w io.Writer, e *computeclient.Error, requestID string) {
	body := map[string]any{"code": e.Code, "status": e.Status, "message": e.Message}
	if e.RetryAfterMs != nil {
		body["retryAfterMs"] = *e.RetryAfterMs
	}
	if len(e.Details) > 0 {
		body["details"] = e.Details
	}
	out := map[string]any{"error": body}
	if requestID != "" {
		out["requestId"] = requestID
	}
	raw, _ := json.MarshalIndent(out, "", "  ")
	fmt.Fprintln(w, string(raw))
}

// writeIDs prints, for -q, the own id (idField) of each item of a list
// answer, or of the one object answered; without idField, the first field
// in the answer's order whose name ends in Id, other than tenantId.
func writeIDs(w io.Writer, data []byte, idField string) error {
	v, err := parseOrdered(data)
	if err != nil {
		return err
	}
	objs := []*value{v}
	if v.isList() {
		objs = v.get("items").elems
	}
	for _, o := range objs {
		if o.kind != kindObject {
			continue
		}
		for i, k := range o.keys {
			val := o.vals[i]
			if val.kind != kindString {
				continue
			}
			if k == idField || (idField == "" && strings.HasSuffix(k, "Id") && k != TenantField) {
				fmt.Fprintln(w, val.str)
				break
			}
		}
	}
	return nil
}
