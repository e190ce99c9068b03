// Package plugins runs the out-of-process plugins of the plugins option
// (docs/plugins.md) and serves their methods: it starts each plugin's
// executable over github.com/hashicorp/go-plugin (gRPC, pluginproto),
// checks it against the plugin's catalog, restarts it with backoff when it
// exits, and implements api.PluginCaller, through which the generated
// registry sends a plugin method's validated, decided call to its process
// and writes the events it answers in the call's transaction.
package plugins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"computeplane/gen/api"
	"computeplane/internal/config"
	"computeplane/internal/iam"
	"computeplane/internal/outbox"
	"computeplane/internal/reqmeta"
	"computeplane/internal/store"
	"computeplane/internal/system"
	"computeplane/pluginproto"
)

// Timings of the supervision of a plugin process.
const (
	// StartTimeout bounds a plugin's start: handshake and Describe.
	StartTimeout = 10 * time.Second
	// CallTimeout bounds one call to a plugin, inside the call's own
	// deadline.
	CallTimeout = 5 * time.Second
	// MinBackoff and MaxBackoff bound the wait before a restart, doubled
	// after each failed or short-lived run.
	MinBackoff = 200 * time.Millisecond
	MaxBackoff = 10 * time.Second
	// StableAfter is how long a run must last for the next restart to
	// start again from MinBackoff.
	StableAfter = 30 * time.Second
	// checkEvery is how often a running plugin's process is looked at;
	// every pingEvery-th look (and after a failed call) pings it too.
	checkEvery = 100 * time.Millisecond
	pingEvery  = 20
)

// Catalog returns the methods the catalog built into this binary holds
// for plugin id (group.method), sorted; none when it has no catalog.
func Catalog(id string) []string {
	var out []string
	for _, m := range api.Methods {
		if m.Plugin == id {
			out = append(out, m.Group+"."+m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Check checks each configured plugin against this build and the file
// system, offline: a catalog built in for its id, an executable at its
// path whose SHA-256 is the configured one. Problems name the option
// (plugins[i].field).
func Check(list []config.Plugin) error {
	var problems []*config.Error
	for i, p := range list {
		opt := fmt.Sprintf("plugins[%d]", i)
		if len(Catalog(p.ID)) == 0 {
			problems = append(problems, &config.Error{Option: opt + ".id",
				Message: fmt.Sprintf("no plugin %q is built into this binary: its catalog (plugins/%s/catalog) must be generated into it (make gen); built in: %s", p.ID, p.ID, strings.Join(builtIn(), ", "))})
		}
		if err := checkBinary(opt, p); err != nil {
			problems = append(problems, err)
		}
	}
	return config.Join(problems)
}

func builtIn() []string {
	var ids []string
	for _, m := range api.Methods {
		if m.Plugin != "" && !slices.Contains(ids, m.Plugin) {
			ids = append(ids, m.Plugin)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return []string{"none"}
	}
	return ids
}

func checkBinary(prefix string, p config.Plugin) *config.Error {
	opt := func(field string) string { return prefix + "." + field }
	fi, err := os.Stat(p.Path)
	switch {
	case err != nil:
		return &config.Error{Option: opt("path"), Message: fmt.Sprintf("%s cannot be read: %v", p.Path, errors.Unwrap(err))}
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return &config.Error{Option: opt("path"), Message: fmt.Sprintf("%s is not an executable file", p.Path)}
	}
	sum, err := fileSHA256(p.Path)
	if err != nil {
		return &config.Error{Option: opt("path"), Message: err.Error()}
	}
	if sum != p.SHA256 {
		return &config.Error{Option: opt("sha256"), Message: fmt.Sprintf("%s has SHA-256 %s, not the configured one", p.Path, sum)}
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// EventTypes is the event catalog of a deployment: the service's own
// types and those of the configured plugins (webhooks.eventTypes).
func EventTypes(list []config.Plugin) []api.EventSpec {
	var out []api.EventSpec
	for _, e := range api.EventTypes {
		if e.Plugin == "" || slices.ContainsFunc(list, func(p config.Plugin) bool { return p.ID == e.Plugin }) {
			out = append(out, e)
		}
	}
	return out
}

// Host runs the configured plugins and serves their methods.
type Host struct {
	log     *slog.Logger
	runners map[string]*runner
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

var _ api.PluginCaller = (*Host)(nil)

// New builds the host of list; nothing runs before Start.
func New(list []config.Plugin, log *slog.Logger) *Host {
	h := &Host{log: log, runners: map[string]*runner{}}
	for _, p := range list {
		h.runners[p.ID] = &runner{cfg: p, log: log.With("plugin", p.ID), kick: make(chan struct{}, 1), first: make(chan struct{})}
	}
	return h
}

// Start starts every plugin and supervises it until Close; it waits, at
// most StartTimeout, for each first start to succeed or fail, so that a
// process that starts healthy serves its plugins' first calls.
func (h *Host) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	for _, r := range h.runners {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			r.run(ctx)
		}()
	}
	deadline := time.After(StartTimeout)
	for _, r := range h.runners {
		select {
		case <-r.first:
		case <-deadline:
			return
		}
	}
}

// Close stops every plugin process and waits for their supervisors.
func (h *Host) Close() {
	if h.cancel != nil {
		h.cancel()
	}
	h.wg.Wait()
}

// Configured reports whether plugin id runs in this process.
func (h *Host) Configured(id string) bool { _, ok := h.runners[id]; return ok }

// Pid is the process id of plugin id while it runs, 0 otherwise.
func (h *Host) Pid(id string) int {
	r := h.runners[id]
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client == nil || r.methods == nil {
		return 0
	}
	if rc := r.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// Precheck answers NOT_FOUND, before authentication, for a method of a
// plugin this deployment does not run: a route that is not mounted.
func (h *Host) Precheck(m *api.Method) error {
	if m.Plugin != "" && !h.Configured(m.Plugin) {
		return api.Errorf(api.CodeNotFound, "no method at %s: plugin %s is not configured", m.Route, m.Plugin)
	}
	return nil
}

// CallPlugin sends the call of the method at route to its plugin (the
// generated registry's Invoke), inside the call's transaction.
func (h *Host) CallPlugin(ctx context.Context, route string, in, out any) error {
	m := api.Lookup(route)
	if m == nil || m.Plugin == "" {
		return fmt.Errorf("plugins: %s is not a plugin's method", route)
	}
	r := h.runners[m.Plugin]
	if r == nil {
		return h.Precheck(m)
	}
	methods, retry := r.current()
	if methods == nil {
		return api.Errorf(api.CodeUnavailable, "plugin %s is not running; it is being restarted, retry later", m.Plugin).
			WithDetails(map[string]any{"retryAfterMs": retry.Milliseconds()})
	}
	input, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req := &pluginproto.CallRequest{
		Method: m.Group + "." + m.Name, Input: input,
		RequestID: reqmeta.FromContext(ctx).RequestID, ReadOnly: m.Kind == api.KindRead,
	}
	if s := iam.SessionFromContext(ctx); s != nil && s.Caller != nil {
		req.Caller = pluginproto.Caller{IdentityID: s.Caller.IdentityID, IdentityKind: s.Caller.IdentityKind, TenantID: s.Caller.TenantID}
	}
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	resp, err := methods.Call(cctx, req)
	if err != nil {
		if status.Code(err) == codes.Unknown {
			// The plugin's own failure, answered: not a transport fault.
			return fmt.Errorf("plugin %s: %w", m.Plugin, err)
		}
		// The process is gone or does not answer: have it looked at now
		// rather than at the next check.
		r.poke()
		h.log.Warn("plugin call failed", "plugin", m.Plugin, "method", m.FullName, "error", err.Error())
		return api.Errorf(api.CodeUnavailable, "plugin %s did not answer; retry later", m.Plugin).
			WithDetails(map[string]any{"retryAfterMs": MinBackoff.Milliseconds() * 5})
	}
	if e := resp.Error; e != nil {
		return serviceError(m, e)
	}
	if err := h.publish(ctx, m, input, resp.Events); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(resp.Output))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("plugin %s: the output of %s does not fit its catalog: %w", m.Plugin, m.FullName, err)
	}
	return nil
}

// serviceError turns a plugin's error answer into the service error it
// names; a code the catalog does not have is the plugin's fault.
func serviceError(m *api.Method, e *pluginproto.Error) error {
	code := api.Code(e.Code)
	if !slices.Contains(api.Codes, code) || code == api.CodeInternalError {
		return fmt.Errorf("plugin %s answered %s with the unknown code %q: %s", m.Plugin, m.FullName, e.Code, e.Message)
	}
	return api.Errorf(code, "%s", e.Message).WithDetails(e.Details)
}

// publish writes the events a call answered into its transaction: only the
// types its method declares, each payload as its catalog declares it,
// never for a read, with the call's tenant.
func (h *Host) publish(ctx context.Context, m *api.Method, input []byte, events []pluginproto.Event) error {
	if len(events) == 0 {
		return nil
	}
	if m.Kind != api.KindMutation {
		return fmt.Errorf("plugin %s published events from the read %s", m.Plugin, m.FullName)
	}
	tx, ok := store.TxFromContext(ctx)
	if !ok {
		return fmt.Errorf("plugin %s: %s ran outside a transaction", m.Plugin, m.FullName)
	}
	var tenant struct {
		TenantID string `json:"tenantId"`
	}
	_ = json.Unmarshal(input, &tenant)
	if tenant.TenantID == "" {
		if s := iam.SessionFromContext(ctx); s != nil && s.Caller != nil {
			tenant.TenantID = s.Caller.TenantID
		}
	}
	for _, e := range events {
		if !slices.Contains(m.Events, e.Type) {
			return fmt.Errorf("plugin %s published %q, which %s does not declare", m.Plugin, e.Type, m.FullName)
		}
		data := e.Data
		if len(data) == 0 {
			data = json.RawMessage("{}")
		}
		if err := checkPayload(m.Plugin, e.Type, data); err != nil {
			return err // the call fails and its transaction rolls back: nothing of it is written
		}
		if err := outbox.Write(ctx, tx, outbox.Event{Type: e.Type, Subject: e.Subject, TenantID: tenant.TenantID, Data: data}); err != nil {
			return err
		}
	}
	return nil
}

// runner supervises one plugin's process.
type runner struct {
	cfg config.Plugin
	log *slog.Logger

	mu      sync.Mutex
	client  *plugin.Client
	methods pluginproto.Methods // nil while the plugin is down
	next    time.Time           // while down: when the next start is tried

	kick  chan struct{}
	first chan struct{} // closed after the first start
}

// current is the running plugin's methods, or nil and how long until the
// next start is tried.
func (r *runner) current() (pluginproto.Methods, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.methods != nil {
		return r.methods, 0
	}
	return nil, max(time.Until(r.next), MinBackoff)
}

func (r *runner) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run starts the plugin and starts it again whenever it stops, backing
// off, until ctx ends.
func (r *runner) run(ctx context.Context) {
	backoff := MinBackoff
	firstDone := sync.OnceFunc(func() { close(r.first) })
	defer firstDone()
	for {
		started := time.Now()
		client, methods, err := r.start(ctx)
		firstDone()
		if err == nil {
			r.mu.Lock()
			r.client, r.methods = client, methods
			r.mu.Unlock()
			r.log.Info("plugin started", "pid", client.ReattachConfig().Pid)
			r.watch(ctx, client)
			client.Kill()
			if ctx.Err() != nil {
				r.down(time.Time{})
				return
			}
			if time.Since(started) >= StableAfter {
				backoff = MinBackoff
			}
			r.log.Warn("plugin stopped; restarting", "in", backoff.String())
		} else {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("plugin did not start; retrying", "error", err.Error(), "in", backoff.String())
		}
		r.down(time.Now().Add(backoff))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, MaxBackoff)
	}
}

func (r *runner) down(next time.Time) {
	r.mu.Lock()
	r.client, r.methods, r.next = nil, nil, next
	r.mu.Unlock()
}

// watch returns when the plugin's process exited or stopped answering
// pings, or ctx ended.
func (r *runner) watch(ctx context.Context, client *plugin.Client) {
	t := time.NewTicker(checkEvery)
	defer t.Stop()
	for tick := 1; ; tick++ {
		ping := tick%pingEvery == 0
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
			ping = true
		}
		if client.Exited() {
			return
		}
		if !ping {
			continue
		}
		proto, err := client.Client()
		if err != nil || proto.Ping() != nil {
			r.log.Warn("plugin does not answer pings; restarting it")
			return
		}
	}
}

// start launches the plugin's executable (its checksum checked by
// go-plugin before it runs), without the service's environment (which
// holds its secrets), and checks what it describes against its catalog.
func (r *runner) start(ctx context.Context) (*plugin.Client, pluginproto.Methods, error) {
	want, err := hex.DecodeString(r.cfg.SHA256)
	if err != nil {
		return nil, nil, err
	}
	dataDir, err := filepath.Abs(r.cfg.DataDir)
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("data directory: %w", err)
	}
	cmd := exec.Command(r.cfg.Path)
	cmd.Env = []string{pluginproto.EnvDataDir + "=" + dataDir, "PATH=/usr/bin:/bin", "TMPDIR=" + os.TempDir()}
	cmd.Dir = dataDir
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  pluginproto.Handshake,
		Plugins:          plugin.PluginSet{pluginproto.PluginName: &pluginproto.GRPCPlugin{}},
		Cmd:              cmd,
		SkipHostEnv:      true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		SecureConfig:     &plugin.SecureConfig{Checksum: want, Hash: sha256.New()},
		StartTimeout:     StartTimeout,
		Logger:           hclogTo(r.log),
	})
	methods, err := describe(ctx, client, r.cfg.ID)
	if err != nil {
		client.Kill()
		return nil, nil, err
	}
	return client, methods, nil
}

func describe(ctx context.Context, client *plugin.Client, id string) (pluginproto.Methods, error) {
	proto, err := client.Client()
	if err != nil {
		return nil, err
	}
	raw, err := proto.Dispense(pluginproto.PluginName)
	if err != nil {
		return nil, err
	}
	methods, ok := raw.(pluginproto.Methods)
	if !ok {
		return nil, fmt.Errorf("plugin dispensed %T", raw)
	}
	dctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	d, err := methods.Describe(dctx)
	if err != nil {
		return nil, fmt.Errorf("describe: %w", err)
	}
	if d.PluginID != id {
		return nil, fmt.Errorf("the executable is plugin %q, not %q", d.PluginID, id)
	}
	for _, m := range Catalog(id) {
		if !slices.Contains(d.Methods, m) {
			return nil, fmt.Errorf("the plugin does not serve %s of its catalog", m)
		}
	}
	return methods, nil
}

// hclogTo sends go-plugin's log (and the plugin's stderr) to log, at warn
// and above: a plugin's chatter is its own.
func hclogTo(log *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   "plugin",
		Level:  hclog.Warn,
		Output: slogWriter{log},
	})
}

type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Warn("plugin log", "line", strings.TrimSpace(string(p)))
	return len(p), nil
}

// SelfCheck is the plugins' part of system.selfCheck: one finding per
// configured plugin, an error while it is not running in this process.
func (h *Host) SelfCheck() system.Check {
	return system.Check{Name: "plugins", Run: func(context.Context, pgx.Tx) ([]api.Finding, error) {
		ids := slices.Sorted(maps.Keys(h.runners))
		out := make([]api.Finding, 0, len(ids))
		for _, id := range ids {
			if pid := h.Pid(id); pid != 0 {
				out = append(out, api.Finding{Check: "plugins", Severity: system.SeverityInfo,
					Message: fmt.Sprintf("plugin %s is running (pid %d)", id, pid)})
				continue
			}
			out = append(out, api.Finding{Check: "plugins", Severity: system.SeverityError,
				Message: fmt.Sprintf("plugin %s is not running in this process; its methods answer UNAVAILABLE while it restarts", id)})
		}
		return out, nil
	}}
}
