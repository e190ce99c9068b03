package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"computeplane/internal/whsig"
)

// Commands of computectl that are not API methods: they read GET /watch,
// the tenant's event stream.
var builtins = map[string]*Method{
	"events/tail": {
		Name:        "tail",
		Kind:        "read",
		Description: "Print the tenant's events as they commit (GET /watch), one JSON object per line, until interrupted.",
		Flags: []Flag{
			{Name: "types", Field: "types", Type: String, Help: "event type patterns, comma-separated (site.created, pool.*, *)"},
			{Name: "max", Field: "max", Type: Int, Help: "stop after this many events"},
		},
	},
	"webhooks/listen": {
		Name: "listen",
		Kind: "read",
		Description: "Relay the tenant's events, signed like webhook deliveries (Standard Webhooks), to a local endpoint: " +
			"test a receiver without a public URL.",
		Flags: []Flag{
			{Name: "forward-to", Field: "forwardTo", Type: String, Required: true, Help: "URL each event is POSTed to"},
			{Name: "secret", Field: "secret", Type: String, Help: "whsec_ signing secret (default: a new one, printed)"},
			{Name: "types", Field: "types", Type: String, Help: "event type patterns, comma-separated"},
			{Name: "max", Field: "max", Type: Int, Help: "stop after this many events"},
		},
	},
}

func builtin(g *Group, name string) *Method { return builtins[g.Name+"/"+name] }

func isBuiltin(m *Method) bool {
	for _, b := range builtins {
		if b == m {
			return true
		}
	}
	return false
}

// streamEvent is one Server-Sent Event of /watch.
type streamEvent struct {
	ID, Type string
	Data     []byte
}

// watch reads the tenant's stream and calls fn per event until ctx ends,
// the stream ends, or fn returns false.
func watch(ctx context.Context, set *settings, types string, fn func(streamEvent) (bool, error)) error {
	if set.tenant == "" {
		var err error
		if set.tenant, err = whoamiTenant(ctx, set); err != nil {
			return err
		}
	}
	q := url.Values{"tenantId": {set.tenant}}
	if types != "" {
		q.Set("types", types)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, set.origin+"/watch?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+set.token)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("GET /watch: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var ev streamEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Data != nil {
				more, err := fn(ev)
				if err != nil || !more {
					return err
				}
			}
			ev = streamEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.ID = line[len("id: "):]
		case strings.HasPrefix(line, "event: "):
			ev.Type = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			ev.Data = []byte(line[len("data: "):])
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

// runBuiltin runs events tail or webhooks listen.
func (inv *invocation) runBuiltin(ctx context.Context, getenv func(string) string, s Streams) (int, error) {
	set, err := inv.settings(getenv)
	if err != nil {
		return 0, err
	}
	opts := map[string]string{}
	for _, fv := range inv.flags {
		opts[fv.Name] = fv.Value
	}
	max := -1
	if v, ok := opts["max"]; ok {
		if max, err = strconv.Atoi(v); err != nil || max < 1 {
			return 0, usagef("--max must be a positive integer, not %q", v)
		}
	}
	seen := 0
	done := func() bool { seen++; return max < 0 || seen < max }
	switch inv.method.Name {
	case "tail":
		return ExitOK, watch(ctx, set, opts["types"], func(ev streamEvent) (bool, error) {
			var compact bytes.Buffer
			if err := json.Compact(&compact, ev.Data); err != nil {
				return false, err
			}
			fmt.Fprintln(s.Stdout, compact.String())
			return done(), nil
		})
	}
	target := opts["forward-to"]
	if target == "" {
		return 0, usagef("missing required flag --forward-to")
	}
	if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return 0, usagef("--forward-to must be an http or https URL, not %q", target)
	}
	secret := opts["secret"]
	if secret == "" {
		if secret, _, err = whsig.NewSecret(); err != nil {
			return 0, err
		}
	}
	key, err := whsig.ParseSecret(secret)
	if err != nil {
		return 0, usagef("--secret: %v", err)
	}
	fmt.Fprintf(s.Stderr, "forwarding the events of tenant %s to %s, signed with %s\n", set.tenant, target, secret)
	client := &http.Client{Timeout: 15 * time.Second}
	return ExitOK, watch(ctx, set, opts["types"], func(ev streamEvent) (bool, error) {
		id := eventID(ev)
		ts := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(ev.Data))
		if err != nil {
			return false, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(whsig.HeaderID, id)
		req.Header.Set(whsig.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		req.Header.Set(whsig.HeaderSignature, whsig.Sign([][]byte{key}, id, ts, ev.Data))
		req.Header.Set("X-Service-Delivery", id)
		resp, err := client.Do(req)
		if err != nil {
			fmt.Fprintf(s.Stderr, "%s %s -> %v\n", ev.Type, id, err)
			return done(), nil // the receiver may come back; keep relaying
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		fmt.Fprintf(s.Stdout, "%s %s -> %d\n", ev.Type, id, resp.StatusCode)
		return done(), nil
	})
}

// eventID is the CloudEvent's id, the stream's id when it has none.
func eventID(ev streamEvent) string {
	var e struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(ev.Data, &e) == nil && e.ID != "" {
		return e.ID
	}
	return ev.ID
}
