package providers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"computeplane/internal/wire"
)

// Issue is one problem of a config, as details.issues lists them.
type Issue struct {
	Message string `json:"message"`
	Path    string `json:"path"`
}

// Reference schemes a secret-like config field may hold.
var Schemes = []string{"secret://", "vault://", "env://"}

// secretLike names the fields that hold credentials: their values must be
// references, never the credential itself.
var secretLike = regexp.MustCompile(`(?i)(token|secret|password|key)$`)

// SecretLike reports whether a config field's name ends in token, secret,
// password or key (any case).
func SecretLike(name string) bool { return secretLike.MatchString(name) }

// envName is what env:// may name.
var envName = wire.MustPattern(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// vaultPath is what vault:// may name: a path and an optional #field.
var vaultPath = wire.MustPattern(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}(#[A-Za-z0-9._-]{1,64})?$`)

// secretPath is what secret:// may name (secrets.ParseReference has the
// final word when it is resolved).
var secretPath = wire.MustPattern(`^(tenants/[A-Za-z0-9._:-]{1,128}|fleet)/[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckReference says what is wrong with v as a reference ("" when it is
// a well-formed secret://, vault:// or env:// reference).
func CheckReference(v string) string {
	switch {
	case strings.HasPrefix(v, "secret://"):
		if !secretPath.MatchString(v[len("secret://"):]) {
			return "a secret:// reference is secret://tenants/<tenantId>/<name> or secret://fleet/<name>"
		}
	case strings.HasPrefix(v, "vault://"):
		if !vaultPath.MatchString(v[len("vault://"):]) {
			return "a vault:// reference is vault://<path>[#<field>]"
		}
	case strings.HasPrefix(v, "env://"):
		if !envName.MatchString(v[len("env://"):]) {
			return "an env:// reference is env://<VARIABLE>"
		}
	default:
		return "must be a secret://, vault:// or env:// reference, never the value itself"
	}
	return ""
}

// References checks every secret-like field of config, at any depth, and
// returns an issue for each one that is not a reference. Paths start at
// "config".
func References(config any) []Issue {
	var out []Issue
	var walk func(v any, path string, secret bool)
	walk = func(v any, path string, secret bool) {
		if _, isString := v.(string); secret && !isString && v != nil {
			out = append(out, Issue{Path: path, Message: "must be a secret://, vault:// or env:// reference (a string)"})
			return
		}
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(x[k], path+"."+k, SecretLike(k))
			}
		case []any:
			for i, e := range x {
				walk(e, path+"["+strconv.Itoa(i)+"]", false)
			}
		case string:
			if secret {
				if msg := CheckReference(x); msg != "" {
					out = append(out, Issue{Path: path, Message: msg})
				}
			}
		}
	}
	walk(config, "config", false)
	return out
}

// Ref is a reference held by a secret-like field.
type Ref struct {
	Path string
	Ref  string
}

// Refs lists the well-formed references of config's secret-like fields,
// at any depth, with their paths.
func Refs(config any) []Ref {
	var out []Ref
	var walk func(v any, path string, secret bool)
	walk = func(v any, path string, secret bool) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(x[k], path+"."+k, SecretLike(k))
			}
		case []any:
			for i, e := range x {
				walk(e, path+"["+strconv.Itoa(i)+"]", false)
			}
		case string:
			if secret && CheckReference(x) == "" {
				out = append(out, Ref{Path: path, Ref: x})
			}
		}
	}
	walk(config, "config", false)
	return out
}

type schema struct{ s *jsonschema.Schema }

func compile(m Manifest) (*schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(m.ConfigSchema))
	if err != nil {
		return nil, fmt.Errorf("the config schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	// Patterns as compact matchers where they can be (wire.MustPattern says why).
	c.UseRegexpEngine(func(src string) (jsonschema.Regexp, error) { return wire.CompilePattern(src) })
	c.DefaultDraft(jsonschema.Draft2020)
	url := "urn:computeplane:provider:" + m.Name
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("the config schema: %w", err)
	}
	return &schema{s: s}, nil
}

var printer = message.NewPrinter(language.English)

// CheckConfig returns every issue of config: the secret-like fields that
// are not references, then what the manifest's schema rejects.
func CheckConfig(s *schema, config any) []Issue {
	out := References(config)
	raw, err := json.Marshal(config)
	if err != nil {
		return append(out, Issue{Path: "config", Message: "is not JSON"})
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return append(out, Issue{Path: "config", Message: "is not JSON"})
	}
	err = s.s.Validate(inst)
	if err == nil {
		return out
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return append(out, Issue{Path: "config", Message: err.Error()})
	}
	seen := map[Issue]bool{}
	var leaves func(e *jsonschema.ValidationError)
	leaves = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			p := "config"
			for _, seg := range e.InstanceLocation {
				if _, err := strconv.Atoi(seg); err == nil {
					p += "[" + seg + "]"
				} else {
					p += "." + seg
				}
			}
			is := Issue{Path: p, Message: e.ErrorKind.LocalizedString(printer)}
			if !seen[is] {
				seen[is] = true
				out = append(out, is)
			}
			return
		}
		for _, c := range e.Causes {
			leaves(c)
		}
	}
	leaves(ve)
	return out
}

// Check validates config against a manifest (outside a registry: tests,
// tools).
func (m Manifest) Check(config any) ([]Issue, error) {
	s, err := compile(m)
	if err != nil {
		return nil, err
	}
	return CheckConfig(s, config), nil
}
