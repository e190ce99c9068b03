package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// TenantField is the input field SERVICE_TENANT fills when it is absent.
const TenantField = "tenantId"

// UsageError is a mistake on the command line or in local input: exit 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// FlagValue is a method flag as given on the command line.
type FlagValue struct {
	Name  string // kebab-case, without dashes
	Value string
}

// BuildInput makes the JSON object sent as a method's input. Layers, each
// overriding the one before: tenant (SERVICE_TENANT, for a method with a
// tenantId field), the JSON object of --input (nil when not given), then
// the flags in command-line order (a repeated flag: the last one wins).
// A flag's text must fit its type and enum; every required field must be
// present at the end. Everything else, and the whole of --input, is left
// to the server, the one authority on inputs: unknown fields in --input
// reach it and come back as INVALID_INPUT naming them.
func BuildInput(m *Method, tenant string, input []byte, flags []FlagValue) ([]byte, error) {
	obj := map[string]json.RawMessage{}
	if tenant != "" && m.Flag(TenantField) != nil {
		obj[TenantField] = mustJSON(tenant)
	}
	if input != nil {
		fromFile, err := parseObject(input)
		if err != nil {
			return nil, err
		}
		for k, v := range fromFile {
			obj[k] = v
		}
	}
	for _, fv := range flags {
		f := m.flagNamed(fv.Name)
		if f == nil {
			return nil, usagef("unknown flag --%s", fv.Name)
		}
		if f.Local {
			continue // computectl's own: read before
		}
		v, err := f.Encode(fv.Value)
		if err != nil {
			return nil, err
		}
		obj[f.Field] = v
	}
	var missing []string
	for _, f := range m.Flags {
		if _, ok := obj[f.Field]; f.Required && !f.Local && !ok {
			missing = append(missing, "--"+f.Name)
		}
	}
	if len(missing) > 0 {
		noun := "flag"
		if len(missing) > 1 {
			noun = "flags"
		}
		return nil, usagef("missing required %s %s (or the fields in --input)", noun, strings.Join(missing, ", "))
	}
	return json.Marshal(obj) // sorted keys: deterministic bodies
}

// parseObject reads the JSON object of --input, keeping each value's text.
func parseObject(data []byte) (map[string]json.RawMessage, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, usagef("--input is empty; it must hold a JSON object")
	}
	if data[0] != '{' {
		return nil, usagef("--input must hold a JSON object")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, usagef("--input is not valid JSON: %v", err)
	}
	return obj, nil
}

// Encode turns a flag's text into the JSON value sent for its field.
func (f *Flag) Encode(text string) (json.RawMessage, error) {
	switch f.Type {
	case String:
		if len(f.Enum) > 0 && !slices.Contains(f.Enum, text) {
			return nil, usagef("--%s must be one of %s, not %q", f.Name, strings.Join(f.Enum, ", "), text)
		}
		return mustJSON(text), nil
	case Int:
		n, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
		if err != nil {
			return nil, usagef("--%s must be an integer, not %q", f.Name, text)
		}
		return json.RawMessage(strconv.FormatInt(n, 10)), nil
	case Number:
		t := strings.TrimSpace(text)
		if !jsonNumber.MatchString(t) {
			return nil, usagef("--%s must be a number, not %q", f.Name, text)
		}
		return json.RawMessage(t), nil
	case Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(text))
		if err != nil {
			return nil, usagef("--%s must be true or false, not %q", f.Name, text)
		}
		return json.RawMessage(strconv.FormatBool(b)), nil
	case Wait:
		return encodeWait(f, text)
	case JSON:
		var buf bytes.Buffer
		if err := json.Compact(&buf, []byte(text)); err != nil {
			return nil, usagef("--%s must be JSON: %v", f.Name, err)
		}
		return buf.Bytes(), nil
	default:
		return nil, fmt.Errorf("--%s has an unknown type %q", f.Name, f.Type)
	}
}

// jsonNumber is the number grammar of RFC 8259.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
