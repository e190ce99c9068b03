// Package telemetry exports a node's host and per-VM metrics (CPU,
// memory, disk and network I/O) to an OpenTelemetry collector over OTLP
// (HTTP, protobuf), with the OpenTelemetry Go SDK.
//
// The settings are compute-agent run's flags, not the control plane's
// configuration: the daemon is the exporter, the collector is reached
// from the node's network (often a collector on the node itself), and
// the control plane has no channel that pushes settings to daemons.
// Every bound of the specification is checked when the daemon starts
// (Config.Check); a bad setting refuses the start with INVALID_CONFIG
// naming the flag.
package telemetry

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"computeplane/internal/configerr"
)

// Bounds of the specification.
const (
	DefaultInterval   = 60 * time.Second
	MinInterval       = 5 * time.Second
	MaxInterval       = 3600 * time.Second
	MaxAttributes     = 32
	MaxAttributeValue = 256
	maxAttributeKey   = 128
)

// Flag names, as the refusals name them.
const (
	FlagEndpoint  = "--telemetry-endpoint"
	FlagInterval  = "--telemetry-interval"
	FlagAttribute = "--telemetry-attribute"
)

// Config is the node-telemetry settings. An empty Endpoint is telemetry
// off.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP URL; a URL without a path
	// gets /v1/metrics.
	Endpoint string
	// Interval between exports; 0 is DefaultInterval.
	Interval time.Duration
	// Attributes are extra resource attributes, each key=value (the
	// repeatable flag's entries).
	Attributes []string
	// Resource is Attributes as Check parsed them.
	Resource map[string]string
}

// Enabled tells whether telemetry is configured.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Check returns the settings with defaults filled in, or every problem
// (each a *configerr.Error, INVALID_CONFIG naming the flag). Attributes without an
// endpoint are refused too: they would do nothing.
func (c Config) Check() (Config, error) {
	var list []*configerr.Error
	bad := func(flag, format string, a ...any) {
		list = append(list, &configerr.Error{Option: flag, Message: fmt.Sprintf(format, a...)})
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Interval < MinInterval || c.Interval > MaxInterval {
		bad(FlagInterval, "%s is outside 5s to 3600s", c.Interval)
	} else if c.Interval%time.Second != 0 {
		bad(FlagInterval, "%s is not a whole number of seconds", c.Interval)
	}
	if c.Endpoint == "" {
		if len(c.Attributes) > 0 {
			bad(FlagAttribute, "resource attributes need %s", FlagEndpoint)
		}
	} else if u, err := endpointURL(c.Endpoint); err != nil {
		bad(FlagEndpoint, "%v", err)
	} else {
		c.Endpoint = u.String()
	}
	if len(c.Attributes) > MaxAttributes {
		bad(FlagAttribute, "%d resource attributes; at most %d", len(c.Attributes), MaxAttributes)
	}
	c.Resource = map[string]string{}
	for _, kv := range c.Attributes {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			bad(FlagAttribute, "%q is not key=value", kv)
			continue
		}
		if _, dup := c.Resource[k]; dup {
			bad(FlagAttribute, "key %q is given twice", k)
			continue
		}
		c.Resource[k] = v
		switch {
		case k == "" || len(k) > maxAttributeKey || strings.ContainsAny(k, "=\r\n") || strings.TrimSpace(k) != k:
			bad(FlagAttribute, "key %q must be 1 to %d characters without '=', spaces at its ends or line breaks", k, maxAttributeKey)
		case strings.ContainsAny(v, "\r\n\v\f\u0085\u2028\u2029"):
			bad(FlagAttribute, "the value of %q must be a single line", k)
		case len([]rune(v)) > MaxAttributeValue:
			bad(FlagAttribute, "the value of %q is %d characters; at most %d", k, len([]rune(v)), MaxAttributeValue)
		}
	}
	if err := configerr.Join(list); err != nil {
		return Config{}, err
	}
	return c, nil
}

// endpointURL allows https, or http to localhost, 127.0.0.1 or [::1];
// never credentials (they would be sent in the clear or logged), a query
// or a fragment.
func endpointURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return nil, fmt.Errorf("%q is not an absolute URL", raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%q carries credentials; the collector endpoint takes none", raw)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, fmt.Errorf("%q has a query or fragment", raw)
	}
	switch u.Scheme {
	case "https":
	case "http":
		switch u.Hostname() {
		case "localhost", "127.0.0.1", "::1":
		default:
			return nil, fmt.Errorf("%q: http only to localhost, 127.0.0.1 or [::1]; use https", raw)
		}
	default:
		return nil, fmt.Errorf("%q must be https (or http to a loopback host)", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/metrics"
	}
	return u, nil
}

// List is a repeatable string flag (flag.Value).
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

// Set appends one entry.
func (l *List) Set(s string) error { *l = append(*l, s); return nil }
