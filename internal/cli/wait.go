package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"computeplane/computeclient"
)

// The Waiting convention: a mutation with wait { timeoutMs } answers when
// its work is done, failed, or at the timeout (at most MaxWait).
const (
	DefaultWait = 30 * time.Second // --wait alone
	MaxWait     = 30 * time.Second // the service waits no longer
	StateFailed = "failed"
	// pollEvery is how often a wait on a terminal reads the object's state.
	pollEvery = 500 * time.Millisecond
)

// IsTerminal reports whether the stream s is a terminal: an *os.File on
// which the TCGETS ioctl answers (golang.org/x/term's test, through x/sys).
func IsTerminal(s any) bool {
	f, ok := s.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// isWaitValue reports whether the argument after --wait is its value (a
// duration or a JSON object) rather than the next argument.
func isWaitValue(arg string) bool {
	if strings.HasPrefix(strings.TrimSpace(arg), "{") {
		return true
	}
	_, err := time.ParseDuration(arg)
	return err == nil
}

// encodeWait is the JSON of --wait: a duration becomes { timeoutMs }.
func encodeWait(f *Flag, text string) (json.RawMessage, error) {
	t := strings.TrimSpace(text)
	if strings.HasPrefix(t, "{") {
		return (&Flag{Name: f.Name, Type: JSON}).Encode(t)
	}
	d, err := time.ParseDuration(t)
	if err != nil || d < 0 {
		return nil, usagef("--%s must be a duration such as 30s (or a JSON object), not %q", f.Name, text)
	}
	if d > MaxWait {
		return nil, usagef("--%s %s: the service waits at most %s", f.Name, text, MaxWait)
	}
	return mustJSON(map[string]int64{"timeoutMs": d.Milliseconds()}), nil
}

// waitGiven reports whether the body asks for a wait.
func waitGiven(m *Method, body []byte) bool {
	f := firstOfType(m, Wait)
	if f == nil {
		return false
	}
	obj, err := parseObject(body)
	if err != nil {
		return false
	}
	v, ok := obj[f.Field]
	return ok && string(v) != "null"
}

func firstOfType(m *Method, t FlagType) *Flag {
	for i := range m.Flags {
		if m.Flags[i].Type == t {
			return &m.Flags[i]
		}
	}
	return nil
}

// stateOf reads the state, error and own id of an answer.
func stateOf(m *Method, data []byte) (state, reason, id string) {
	var obj map[string]any
	if json.Unmarshal(data, &obj) != nil {
		return "", "", ""
	}
	state, _ = obj["state"].(string)
	reason, _ = obj["error"].(string)
	if m.IDField != "" {
		id, _ = obj[m.IDField].(string)
	}
	return state, reason, id
}

// withBody replaces (or, with value nil, removes) one field of a JSON
// object body.
func withBody(body []byte, field string, value json.RawMessage) []byte {
	obj, err := parseObject(body)
	if err != nil {
		return body
	}
	if value == nil {
		delete(obj, field)
	} else {
		obj[field] = value
	}
	out, _ := json.Marshal(obj)
	return out
}

// progress prints each state change of the object a wait is about, read
// with the group's get every pollEvery, until ctx ends.
type progress struct {
	w     io.Writer
	start time.Time
	last  string
}

func (p *progress) show(group, id, state string) {
	if state == "" || state == p.last {
		return
	}
	p.last = state
	fmt.Fprintf(p.w, "%6.1fs  %s %s: %s\n", time.Since(p.start).Seconds(), group, id, state)
}

// follow polls get for id and shows its state changes until ctx ends.
func (p *progress) follow(ctx context.Context, c *computeclient.Client, g *Group, tenant, id string) {
	get := g.method("get")
	if get == nil || get.IDField == "" {
		return
	}
	body := map[string]string{get.IDField: id}
	if get.Flag(TenantField) != nil {
		body[TenantField] = tenant
	}
	raw, _ := json.Marshal(body)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		x := &exchange{body: raw}
		if get.Call(withExchange(ctx, x), c) == nil {
			if data, err := x.data(); err == nil {
				state, _, _ := stateOf(get, data)
				p.show(g.Name, id, state)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
