package wire_test

import (
	"bytes"
	"encoding/json"
	"math"
	"math/big"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"computeplane/internal/wire"
)

func num(s string) json.Number { return json.Number(s) }

func TestParseObject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want map[string]any
		err  string // prefix of the issue message; "" for success
	}{
		{name: "empty body is the empty object", body: "", want: map[string]any{}},
		{name: "whitespace only is the empty object", body: " \t\r\n ", want: map[string]any{}},
		{name: "empty object", body: "{}", want: map[string]any{}},
		{name: "surrounding whitespace", body: "\n {\"a\": 1} \n", want: map[string]any{"a": num("1")}},
		{name: "numbers stay json.Number", body: `{"i":12345678901234567890,"f":1.5e3}`,
			want: map[string]any{"i": num("12345678901234567890"), "f": num("1.5e3")}},
		{name: "nested values", body: `{"a":{"b":[true,null,"x"]}}`,
			want: map[string]any{"a": map[string]any{"b": []any{true, nil, "x"}}}},
		{name: "array", body: `[]`, err: "body must be a JSON object, got array"},
		{name: "string", body: `"x"`, err: "body must be a JSON object, got string"},
		{name: "number", body: `12`, err: "body must be a JSON object, got number"},
		{name: "boolean", body: `true`, err: "body must be a JSON object, got boolean"},
		{name: "null", body: `null`, err: "body must be a JSON object, got null"},
		{name: "truncated", body: `{"a":`, err: "body is not valid JSON: unexpected end of input"},
		{name: "open brace", body: `{`, err: "body is not valid JSON: unexpected end of input"},
		{name: "syntax error has an offset", body: `{"a":}`, err: "body is not valid JSON: invalid character '}' looking for beginning of value at offset 6"},
		{name: "single quotes", body: `{'a':1}`, err: "body is not valid JSON: invalid character '\\'' looking for beginning of object key string"},
		{name: "trailing object", body: `{}{}`, err: "body has data after the JSON object"},
		{name: "trailing word", body: `{} x`, err: "body has data after the JSON object"},
		{name: "trailing comma", body: `{},`, err: "body has data after the JSON object"},
		{name: "invalid UTF-8 in a string", body: "{\"a\":\"\xff\"}", err: "body is not valid UTF-8"},
		{name: "invalid UTF-8 alone", body: "\xc3\x28", err: "body is not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			obj, issue := wire.ParseObject([]byte(tt.body))
			if tt.err != "" {
				require.Nil(t, obj)
				require.NotNil(t, issue)
				require.Empty(t, issue.Path, "a body issue is about the body itself")
				require.True(t, strings.HasPrefix(issue.Message, tt.err), "message %q does not start with %q", issue.Message, tt.err)
				return
			}
			require.Nil(t, issue)
			require.Equal(t, tt.want, obj)
		})
	}
}

// TestParseObjectRefuses: what every body is refused for, whatever the
// method, with the path of the field at fault.
func TestParseObjectRefuses(t *testing.T) {
	t.Parallel()
	// The body is level 1; the object past MaxDepth levels is refused.
	deep := strings.Repeat(`{"a":`, wire.MaxDepth+1) + "1" + strings.Repeat("}", wire.MaxDepth+1)
	tests := []struct {
		name, body, path, msg string
	}{
		{"duplicate key", `{"tenantId":"a","tenantId":"b"}`, "tenantId", "appears more than once"},
		{"duplicate nested key", `{"warm":{"min":1,"max":2,"min":3}}`, "warm.min", "appears more than once"},
		{"duplicate key in an array item", `{"volumes":[{},{"name":"a","name":"a"}]}`, "volumes[1].name", "appears more than once"},
		{"NUL in a string", `{"description":"a\u0000b"}`, "description", wire.NULMessage},
		{"NUL in a nested string", `{"env":{"A":"x\u0000"}}`, "env.A", wire.NULMessage},
		{"NUL in an array string", `{"events":["site.created","\u0000"]}`, "events[1]", wire.NULMessage},
		{"NUL in a key", `{"env":{"A\u0000":"x"}}`, "env", "field names " + wire.NULMessage},
		{"too deep", deep, strings.TrimSuffix(strings.Repeat("a.", wire.MaxDepth), "."), "nesting is deeper than 64 levels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			obj, issue := wire.ParseObject([]byte(tt.body))
			require.Nil(t, obj)
			require.NotNil(t, issue)
			require.Equal(t, tt.path, issue.Path)
			require.Equal(t, tt.msg, issue.Message)
		})
	}
	// Same key at different levels, and in sibling objects, is fine.
	obj, issue := wire.ParseObject([]byte(`{"a":{"a":1},"b":[{"a":1},{"a":2}]}`))
	require.Nil(t, issue)
	require.Len(t, obj, 2)
}

func TestString(t *testing.T) {
	t.Parallel()
	lower := regexp.MustCompile(`^[a-zé]+$`)
	tests := []struct {
		name string
		v    any
		rule wire.StringRule
		want string
		err  string
	}{
		{name: "plain", v: "abc", want: "abc"},
		{name: "empty with no bounds", v: "", want: ""},
		{name: "min counts runes not bytes (too short)", v: "é", rule: wire.StringRule{MinLength: 2}, err: "must be at least 2 characters"},
		{name: "min counts runes not bytes (ok)", v: "éé", rule: wire.StringRule{MinLength: 2}, want: "éé"},
		{name: "max counts runes not bytes (ok)", v: "ééé", rule: wire.StringRule{MaxLength: 3}, want: "ééé"},
		{name: "max counts runes not bytes (too long)", v: "éééé", rule: wire.StringRule{MaxLength: 3}, err: "must be at most 3 characters"},
		{name: "max 0 is unbounded", v: strings.Repeat("x", 10000), want: strings.Repeat("x", 10000)},
		{name: "enum hit", v: "b", rule: wire.StringRule{Enum: []string{"a", "b"}}, want: "b"},
		{name: "enum miss", v: "c", rule: wire.StringRule{Enum: []string{"a", "b"}}, err: "must be one of a, b"},
		{name: "enum is case sensitive", v: "A", rule: wire.StringRule{Enum: []string{"a", "b"}}, err: "must be one of a, b"},
		{name: "pattern hit", v: "café", rule: wire.StringRule{Pattern: lower}, want: "café"},
		{name: "pattern miss", v: "Cafe", rule: wire.StringRule{Pattern: lower}, err: "must match ^[a-zé]+$"},
		{name: "pattern miss in words", v: "Cafe", rule: wire.StringRule{Pattern: lower, Words: "lowercase letters"}, err: "must be lowercase letters (pattern ^[a-zé]+$)"},
		{name: "length is checked before the pattern", v: "ABCD", rule: wire.StringRule{MaxLength: 3, Pattern: lower}, err: "must be at most 3 characters"},
		{name: "number", v: num("1"), err: "must be a string, got number"},
		{name: "null", v: nil, err: "must be a string, got null"},
		{name: "boolean", v: true, err: "must be a string, got boolean"},
		{name: "array", v: []any{"a"}, err: "must be a string, got array"},
		{name: "object", v: map[string]any{}, err: "must be a string, got object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var iss wire.Issues
			got, ok := wire.String(tt.v, "a.b", &tt.rule, &iss)
			if tt.err != "" {
				require.False(t, ok)
				require.Empty(t, got)
				require.Equal(t, []wire.Issue{{Path: "a.b", Message: tt.err}}, iss.List)
				return
			}
			require.True(t, ok)
			require.True(t, iss.Empty())
			require.Equal(t, tt.want, got)
		})
	}
}

func TestBytes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		v    any
		rule wire.StringRule
		want []byte
		err  string
	}{
		{name: "padded", v: "aGk=", want: []byte("hi")},
		{name: "empty is no bytes", v: "", want: []byte{}},
		{name: "binary", v: "AP8=", want: []byte{0, 255}},
		{name: "unpadded", v: "aGk", err: "must be base64 (RFC 4648, standard alphabet, padded): illegal base64 data at input byte 0"},
		{name: "url alphabet", v: "-_8=", err: "must be base64 (RFC 4648, standard alphabet, padded): illegal base64 data at input byte 0"},
		{name: "not base64", v: "hello world", err: "must be base64 (RFC 4648, standard alphabet, padded): illegal base64 data at input byte 5"},
		{name: "the rule bounds the text", v: "aGVsbG8=", rule: wire.StringRule{MaxLength: 4}, err: "must be at most 4 characters"},
		{name: "number", v: num("1"), err: "must be a string, got number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var iss wire.Issues
			got, ok := wire.Bytes(tt.v, "a.b", &tt.rule, &iss)
			if tt.err != "" {
				require.False(t, ok)
				require.Nil(t, got)
				require.Equal(t, []wire.Issue{{Path: "a.b", Message: tt.err}}, iss.List)
				return
			}
			require.True(t, ok)
			require.True(t, iss.Empty())
			require.Equal(t, tt.want, got)
		})
	}
}

func TestInt(t *testing.T) {
	t.Parallel()
	bounded := wire.IntRule{Min: 1, Max: 10, HasMin: true, HasMax: true}
	tests := []struct {
		name string
		v    any
		rule wire.IntRule
		want int64
		err  string
	}{
		{name: "in bounds", v: num("5"), rule: bounded, want: 5},
		{name: "at the minimum", v: num("1"), rule: bounded, want: 1},
		{name: "at the maximum", v: num("10"), rule: bounded, want: 10},
		{name: "below the minimum", v: num("0"), rule: bounded, err: "must be at least 1"},
		{name: "above the maximum", v: num("11"), rule: bounded, err: "must be at most 10"},
		{name: "negative minimum", v: num("-5"), rule: wire.IntRule{Min: -4, HasMin: true}, err: "must be at least -4"},
		{name: "zero bound is a bound when set", v: num("-1"), rule: wire.IntRule{HasMin: true}, err: "must be at least 0"},
		{name: "unset bounds", v: num("-9223372036854775808"), want: -9223372036854775808},
		{name: "1.0 is an integer", v: num("1.0"), rule: bounded, want: 1},
		{name: "1e1 is an integer", v: num("1e1"), rule: bounded, want: 10},
		{name: "1E+1 is an integer", v: num("1E+1"), rule: bounded, want: 10},
		{name: "150e-1 is an integer", v: num("150e-1"), want: 15},
		{name: "-2.50e1 is an integer", v: num("-2.50e1"), want: -25},
		{name: "0.0e-999 is zero", v: num("0.0e-999"), want: 0},
		{name: "-0 is zero", v: num("-0"), want: 0},
		{name: "int64 max", v: num("9223372036854775807"), want: 9223372036854775807},
		{name: "int64 max written with a fraction", v: num("9223372036854775807.000"), want: 9223372036854775807},
		{name: "1.5 is not an integer", v: num("1.5"), err: "must be an integer"},
		{name: "15e-1 is not an integer", v: num("15e-1"), err: "must be an integer"},
		{name: "a fraction lost in float64 is still refused", v: num("1.0000000000000001"), err: "must be an integer"},
		{name: "2^53+1 is not rounded", v: num("9007199254740993.0"), want: 9007199254740993},
		{name: "int64 max plus one", v: num("9223372036854775808"), err: "must be an integer"},
		{name: "int64 min minus one", v: num("-9223372036854775809"), err: "must be an integer"},
		{name: "1e20", v: num("1e20"), err: "must be an integer"},
		{name: "1e400 (beyond float64)", v: num("1e400"), err: "must be an integer"},
		{name: "huge exponent", v: num("1e99999999999999999999"), err: "must be an integer"},
		{name: "tiny exponent", v: num("1e-99999999999999999999"), err: "must be an integer"},
		{name: "string holding a number", v: "5", err: "must be an integer, got string"},
		{name: "boolean", v: true, err: "must be an integer, got boolean"},
		{name: "null", v: nil, err: "must be an integer, got null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var iss wire.Issues
			got, ok := wire.Int(tt.v, "n", &tt.rule, &iss)
			if tt.err != "" {
				require.False(t, ok)
				require.Zero(t, got)
				require.Equal(t, []wire.Issue{{Path: "n", Message: tt.err}}, iss.List)
				return
			}
			require.True(t, ok, "issues: %v", iss.List)
			require.True(t, iss.Empty())
			require.Equal(t, tt.want, got)
		})
	}
}

func TestFloatBoolObject(t *testing.T) {
	t.Parallel()
	var iss wire.Issues
	r := &wire.FloatRule{Min: 0, Max: 1, HasMin: true, HasMax: true}
	f, ok := wire.Float(num("0.5"), "f", r, &iss)
	require.True(t, ok)
	require.InDelta(t, 0.5, f, 0)
	_, ok = wire.Float(num("1.5"), "f", r, &iss)
	require.False(t, ok)
	_, ok = wire.Float(num("-0.1"), "f", r, &iss)
	require.False(t, ok)
	_, ok = wire.Float(num("1e400"), "f", &wire.FloatRule{}, &iss)
	require.False(t, ok)
	_, ok = wire.Float("1", "f", &wire.FloatRule{}, &iss)
	require.False(t, ok)
	b, ok := wire.Bool(true, "b", &iss)
	require.True(t, ok)
	require.True(t, b)
	_, ok = wire.Bool("true", "b", &iss)
	require.False(t, ok)
	o, ok := wire.Object(map[string]any{"k": "v"}, "o", &iss)
	require.True(t, ok)
	require.Equal(t, map[string]any{"k": "v"}, o)
	_, ok = wire.Object([]any{}, "o", &iss)
	require.False(t, ok)
	require.Equal(t, []wire.Issue{
		{Path: "f", Message: "must be at most 1"},
		{Path: "f", Message: "must be at least 0"},
		{Path: "f", Message: "must be a finite number"},
		{Path: "f", Message: "must be a number, got string"},
		{Path: "b", Message: "must be a boolean, got string"},
		{Path: "o", Message: "must be an object, got array"},
	}, iss.List)
}

func TestArray(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		v    any
		rule wire.CountRule
		err  string
	}{
		{name: "empty with no bounds", v: []any{}},
		{name: "within bounds", v: []any{"a", "b"}, rule: wire.CountRule{Min: 1, Max: 2}},
		{name: "too few", v: []any{}, rule: wire.CountRule{Min: 1, Max: 2}, err: "must have at least 1 items"},
		{name: "too many", v: []any{1, 2, 3}, rule: wire.CountRule{Min: 1, Max: 2}, err: "must have at most 2 items"},
		{name: "max 0 is unbounded", v: make([]any, 1000)},
		{name: "object", v: map[string]any{}, err: "must be an array, got object"},
		{name: "null", v: nil, err: "must be an array, got null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var iss wire.Issues
			got, ok := wire.Array(tt.v, "xs", &tt.rule, &iss)
			if tt.err != "" {
				require.False(t, ok)
				require.Nil(t, got)
				require.Equal(t, []wire.Issue{{Path: "xs", Message: tt.err}}, iss.List)
				return
			}
			require.True(t, ok)
			require.Equal(t, tt.v, got)
			require.True(t, iss.Empty())
		})
	}
}

func TestMap(t *testing.T) {
	t.Parallel()
	upper := regexp.MustCompile(`^[A-Z_]+$`)
	tests := []struct {
		name     string
		v        any
		rule     wire.CountRule
		keys     []string
		good     bool
		wantIssu []wire.Issue
	}{
		{name: "keys come back sorted", v: map[string]any{"B": 1, "A": 2, "C": 3}, rule: wire.CountRule{KeyPattern: upper},
			keys: []string{"A", "B", "C"}, good: true},
		{name: "empty", v: map[string]any{}, keys: []string{}, good: true},
		{name: "at the entry limit", v: map[string]any{"A": 1, "B": 2}, rule: wire.CountRule{Max: 2}, keys: []string{"A", "B"}, good: true},
		{name: "over the entry limit", v: map[string]any{"A": 1, "B": 2, "C": 3}, rule: wire.CountRule{Max: 2},
			wantIssu: []wire.Issue{{Path: "env", Message: "must have at most 2 entries"}}},
		{name: "every bad key is reported, sorted", v: map[string]any{"OK": 1, "lower_b": 2, "lower_a": 3}, rule: wire.CountRule{KeyPattern: upper},
			keys: []string{"OK", "lower_a", "lower_b"},
			wantIssu: []wire.Issue{
				{Path: "env.lower_a", Message: "key must match ^[A-Z_]+$"},
				{Path: "env.lower_b", Message: "key must match ^[A-Z_]+$"},
			}},
		{name: "array", v: []any{}, wantIssu: []wire.Issue{{Path: "env", Message: "must be an object, got array"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var iss wire.Issues
			obj, keys, good := wire.Map(tt.v, "env", &tt.rule, &iss)
			require.Equal(t, tt.good, good)
			require.Equal(t, tt.wantIssu, iss.List)
			if tt.keys != nil {
				require.Equal(t, tt.keys, keys)
				require.Equal(t, tt.v, obj)
			}
		})
	}
}

func TestExactlyOne(t *testing.T) {
	t.Parallel()
	names := []string{"machineId", "offerId"}
	tests := []struct {
		name string
		obj  map[string]any
		ok   bool
	}{
		{name: "first", obj: map[string]any{"machineId": "m"}, ok: true},
		{name: "second", obj: map[string]any{"offerId": "o"}, ok: true},
		{name: "one and a null", obj: map[string]any{"machineId": "m", "offerId": nil}, ok: true},
		{name: "neither", obj: map[string]any{"other": 1}},
		{name: "both null", obj: map[string]any{"machineId": nil, "offerId": nil}},
		{name: "both", obj: map[string]any{"machineId": "m", "offerId": "o"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var iss wire.Issues
			wire.ExactlyOne(tt.obj, "spec", names, &iss)
			if tt.ok {
				require.True(t, iss.Empty())
				return
			}
			require.Equal(t, []wire.Issue{{Path: "spec", Message: "exactly one of machineId, offerId is required"}}, iss.List)
		})
	}
}

func TestUnknownIsSorted(t *testing.T) {
	t.Parallel()
	known := map[string]struct{}{"a": {}, "m": {}}
	obj := map[string]any{"z": 1, "a": 1, "b": 1, "m": 1, "y": 1, "c": 1}
	for range 20 { // map iteration order must not leak
		var iss wire.Issues
		wire.Unknown(obj, "warm", known, &iss)
		require.Equal(t, []wire.Issue{
			{Path: "warm.b", Message: "unknown field"},
			{Path: "warm.c", Message: "unknown field"},
			{Path: "warm.y", Message: "unknown field"},
			{Path: "warm.z", Message: "unknown field"},
		}, iss.List)
	}
	var iss wire.Issues
	wire.Unknown(map[string]any{"x": 1}, "", known, &iss)
	require.Equal(t, []wire.Issue{{Path: "x", Message: "unknown field"}}, iss.List)
	iss = wire.Issues{}
	wire.Unknown(map[string]any{"a": 1}, "", known, &iss)
	require.True(t, iss.Empty())
}

func TestIssues(t *testing.T) {
	t.Parallel()
	var iss wire.Issues
	require.True(t, iss.Empty())
	require.Empty(t, iss.First())

	iss.Add("", "body must be a JSON object, got %s", "array")
	require.False(t, iss.Empty())
	require.Equal(t, "body must be a JSON object, got array", iss.First(), "no path, no prefix")

	iss = wire.Issues{}
	iss.Add(wire.Index(wire.Join("", "volumes"), 2)+".mountPath", "must be at most %d characters", 255)
	iss.Add("later", "is required")
	require.Equal(t, "volumes[2].mountPath: must be at most 255 characters", iss.First(), "the first issue names the error")
	require.Len(t, iss.List, 2)

	wire.Required("warm.min", &iss)
	require.Equal(t, wire.Issue{Path: "warm.min", Message: "is required"}, iss.List[2])

	require.Equal(t, "a", wire.Join("", "a"))
	require.Equal(t, "a.b", wire.Join("a", "b"))
	require.Equal(t, "a[0]", wire.Index("a", 0))
	require.Equal(t, "a[3].b[12]", wire.Index(wire.Join(wire.Index("a", 3), "b"), 12))
}

func TestTypeName(t *testing.T) {
	t.Parallel()
	for v, want := range map[*any]string{
		ptr[any](nil): "null", ptr[any](true): "boolean", ptr[any](num("1")): "number", ptr[any]("s"): "string",
		ptr[any]([]any{}): "array", ptr[any](map[string]any{}): "object", ptr[any](1.5): "float64",
	} {
		require.Equal(t, want, wire.TypeName(*v))
	}
}

func ptr[T any](v T) *T { return &v }

func TestNullableJSON(t *testing.T) {
	t.Parallel()
	type input struct {
		UserData wire.Nullable[string]   `json:"userData,omitzero"`
		Tags     wire.Nullable[[]string] `json:"tags,omitzero"`
	}
	tests := []struct {
		name string
		in   input
		want string
		set  bool
	}{
		{name: "absent is left out", in: input{}, want: `{}`},
		{name: "null", in: input{UserData: wire.Nullable[string]{Present: true, Null: true}}, want: `{"userData":null}`},
		{name: "value", in: input{UserData: wire.Nullable[string]{Present: true, Value: "#!/bin/sh"}}, want: `{"userData":"#!/bin/sh"}`, set: true},
		{name: "empty value is a value", in: input{UserData: wire.Nullable[string]{Present: true}}, want: `{"userData":""}`, set: true},
		{name: "non-comparable value type", in: input{Tags: wire.Nullable[[]string]{Present: true, Value: []string{"a"}}}, want: `{"tags":["a"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := json.Marshal(tt.in)
			require.NoError(t, err)
			require.JSONEq(t, tt.want, string(got))
			require.Equal(t, tt.set, tt.in.UserData.Set())
		})
	}
	// A value that was never marked present is not set and writes null.
	n := wire.Nullable[int]{Value: 3}
	require.False(t, n.Set())
	b, err := json.Marshal(n)
	require.NoError(t, err)
	require.Equal(t, "null", string(b))
}

// FuzzParseObject checks that ParseObject never panics, that it either
// returns an object or an issue, that it agrees with encoding/json on which
// bodies are one JSON object, and that an object survives a round trip.
func FuzzParseObject(f *testing.F) {
	for _, s := range []string{
		"", " ", "{}", "[]", "null", `"x"`, "1", `{"a":1}`, `{"a":1.0e3,"b":[null,true,{"c":"é"}]}`,
		"{}{}", "{} x", `{"a":`, "\xff", `{"\ud800":"\u0000"}`, `{"a":"<&>"}`, `{"a":1,"a":2}`, `{"n":-0.0E-0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		obj, issue := wire.ParseObject(body)
		if (obj == nil) == (issue == nil) {
			t.Fatalf("want exactly one of an object and an issue, got %v and %v", obj, issue)
		}
		trimmed := bytes.TrimSpace(body)
		oneObject := len(trimmed) == 0 ||
			(utf8.Valid(body) && json.Valid(body) && trimmed[0] == '{')
		if issue != nil && (issue.Message == "appears more than once" ||
			strings.HasSuffix(issue.Message, wire.NULMessage) || strings.HasPrefix(issue.Message, "nesting")) {
			// Refused for a field (a duplicate key, a NUL, deep nesting),
			// which encoding/json lets through.
			oneObject = false
		}
		if oneObject != (obj != nil) {
			t.Fatalf("body %q: encoding/json says one object is %v, ParseObject returned %v, %v", body, oneObject, obj, issue)
		}
		if issue != nil {
			if issue.Message == "" {
				t.Fatalf("bad issue %+v", issue)
			}
			return
		}
		again, err := json.Marshal(obj)
		if err != nil {
			t.Fatalf("re-marshal: %v", err)
		}
		back, issue := wire.ParseObject(again)
		if issue != nil {
			t.Fatalf("round trip of %q: %s", again, issue.Message)
		}
		require.Equal(t, obj, back, "round trip of %q", again)
	})
}

// FuzzInt checks Int against exact rational arithmetic: a JSON number is
// accepted exactly when its value is an integer that fits in int64.
func FuzzInt(f *testing.F) {
	for _, s := range []string{"0", "-0", "1.0", "1.5", "1e3", "15e-1", "9007199254740993.0", "1.0000000000000001",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-92233720368547758.08e2", "0.00e-5"} {
		f.Add(s)
	}
	numRe := regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]{1,3})?$`)
	minI, maxI := new(big.Int).SetInt64(math.MinInt64), new(big.Int).SetInt64(math.MaxInt64)
	f.Fuzz(func(t *testing.T, lit string) {
		if len(lit) > 60 || !numRe.MatchString(lit) {
			return
		}
		r, ok := new(big.Rat).SetString(lit)
		if !ok {
			t.Fatalf("big.Rat refuses %q", lit)
		}
		want := r.IsInt() && r.Num().Cmp(minI) >= 0 && r.Num().Cmp(maxI) <= 0
		var iss wire.Issues
		got, ok := wire.Int(json.Number(lit), "n", &wire.IntRule{}, &iss)
		if ok != want {
			t.Fatalf("%q: accepted %v, want %v", lit, ok, want)
		}
		if ok && got != r.Num().Int64() {
			t.Fatalf("%q: got %d, want %s", lit, got, r.Num())
		}
	})
}

// FuzzParseFastMatches holds ParseObject's single pass to its
// encoding/json passes: whatever the fast path accepts, the slow one
// accepts too, with the same tree; and what the slow one accepts without
// an issue the fast one may only decline (never answer differently).
func FuzzParseFastMatches(f *testing.F) {
	for _, s := range []string{
		"{}", " {} ", `{"a":1}`, `{"a":1.0e3,"b":[null,true,false,{"c":"é"}],"d":-0,"e":"\"\\\/\b\f\n\r\t\u00e9\u20ac"}`,
		"{}{}", "{} x", `{"a":`, `{"\ud800":"x"}`, `{"a":"\u0000"}`, `{"a":1,"a":2}`, `{"n":-0.0E-0}`, `{"n":01}`,
		`{"n":1.}`, `{"n":.1}`, `{"n":-}`, `{"n":1e}`, `{"a":[1,]}`, `{"a":{},}`, `{"a" "b"}`, `{"a":tru}`, "{\"a\":\"\t\"}",
		`{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"a":"\uD834\uDD1E"}`, `{"a":"\u00"}`, `{"a":"x\q"}`, `{"a":1E+2,"b":1e-2}`, "\t{\n}\r",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) {
			return // ParseObject refuses it before either path
		}
		fast, ok := wire.ParseFast(body)
		slow, issue := wire.ParseSlow(body)
		if !ok {
			return
		}
		if issue != nil {
			t.Fatalf("body %q: the fast path accepted what encoding/json refuses: %s", body, issue.Message)
		}
		require.Equal(t, slow, fast, "body %q", body)
	})
}
