// Package wire is the runtime the generated decoders in gen/api call: it parses
// a request body into a JSON tree, checks each field against its rule and
// collects every structural issue with its path. It knows nothing about any
// particular method; the generator writes the per-input code.
package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-faster/jx"
)

// Issue is one problem found in an input, with the dotted path of the field
// ("warm.min", "volumes[2].mountPath", "env.HOME"; "" is the body itself).
type Issue struct {
	Message string `json:"message"`
	Path    string `json:"path"`
}

// Issues collects problems in the order they are found; the first one names
// the error.
type Issues struct {
	List []Issue
}

// Add records a problem at path.
func (s *Issues) Add(path, format string, args ...any) {
	s.List = append(s.List, Issue{Path: path, Message: fmt.Sprintf(format, args...)})
}

// Empty reports whether no problem was found.
func (s *Issues) Empty() bool { return len(s.List) == 0 }

// First is the message of the first problem, prefixed by its path.
func (s *Issues) First() string {
	if len(s.List) == 0 {
		return ""
	}
	i := s.List[0]
	if i.Path == "" {
		return i.Message
	}
	return i.Path + ": " + i.Message
}

// Join builds a child path.
func Join(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// Index builds an array element path.
func Index(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// MaxDepth bounds the nesting of objects and arrays in a body.
const MaxDepth = 64

// ParseObject parses a request body. An empty body is the empty object;
// anything but one JSON object (with nothing after it) is an issue. Two
// more things are refused here, once for every field of every method:
// a key that appears twice in one object (two parsers reading one body
// differently is a classic bypass, so there is no "last one wins"), and
// the NUL character (U+0000) in any string or key, which PostgreSQL text
// and jsonb cannot store.
func ParseObject(body []byte) (map[string]any, *Issue) {
	if len(bytes.TrimSpace(body)) == 0 {
		return map[string]any{}, nil
	}
	if !utf8.Valid(body) {
		return nil, &Issue{Message: "body is not valid UTF-8"}
	}
	if obj, ok := parseFast(body); ok {
		return obj, nil
	}
	return parseSlow(body)
}

// parseSlow is ParseObject by encoding/json: one pass to decode, one over
// the tokens for what the decoder lets through. It names every refusal.
func parseSlow(body []byte) (map[string]any, *Issue) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &Issue{Message: "body is not valid JSON: " + jsonProblem(err)}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &Issue{Message: "body has data after the JSON object"}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, &Issue{Message: "body must be a JSON object, got " + TypeName(v)}
	}
	// The body is valid JSON: walk its tokens once more for what the
	// decoder lets through.
	tokens := json.NewDecoder(bytes.NewReader(body))
	tokens.UseNumber()
	if issue := checkValue(tokens, "", 0); issue != nil {
		return nil, issue
	}
	return obj, nil
}

// NULMessage is the issue of a string holding U+0000.
const NULMessage = "must not contain the NUL character (U+0000)"

// checkValue reads one value of a valid JSON document from dec's token
// stream and names the first duplicate key, NUL or excess nesting in it.
func checkValue(dec *json.Decoder, path string, depth int) *Issue {
	tok, err := dec.Token()
	if err != nil {
		return &Issue{Message: "body is not valid JSON: " + jsonProblem(err)}
	}
	switch t := tok.(type) {
	case string:
		if strings.ContainsRune(t, 0) {
			return &Issue{Path: path, Message: NULMessage}
		}
	case json.Delim:
		if depth >= MaxDepth {
			return &Issue{Path: path, Message: fmt.Sprintf("nesting is deeper than %d levels", MaxDepth)}
		}
		if t == '[' {
			for i := 0; dec.More(); i++ {
				if issue := checkValue(dec, Index(path, i), depth+1); issue != nil {
					return issue
				}
			}
		} else {
			seen := map[string]struct{}{}
			for dec.More() {
				tok, _ := dec.Token() // a key: the document is valid
				key, _ := tok.(string)
				if strings.ContainsRune(key, 0) {
					return &Issue{Path: path, Message: "field names " + NULMessage}
				}
				at := Join(path, key)
				if _, dup := seen[key]; dup {
					return &Issue{Path: at, Message: "appears more than once"}
				}
				seen[key] = struct{}{}
				if issue := checkValue(dec, at, depth+1); issue != nil {
					return issue
				}
			}
		}
		_, _ = dec.Token() // the closing delimiter
	}
	return nil
}

func jsonProblem(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Sprintf("%s at offset %d", syn.Error(), syn.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of input"
	}
	return err.Error()
}

// TypeName names the JSON type of a decoded value for messages.
func TypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// Unknown reports every key of obj that is not in known, sorted, so the
// order of issues does not depend on map iteration.
func Unknown(obj map[string]any, path string, known map[string]struct{}, iss *Issues) {
	var extra []string
	for k := range obj {
		if _, ok := known[k]; !ok {
			extra = append(extra, k)
		}
	}
	if len(extra) == 0 {
		return
	}
	slices.Sort(extra)
	for _, k := range extra {
		iss.Add(Join(path, k), "unknown field")
	}
}

// Required records a missing required field.
func Required(path string, iss *Issues) { iss.Add(path, "is required") }

// StringRule holds the checks of a string field.
type StringRule struct {
	MinLength int // in characters (runes)
	MaxLength int // 0: unbounded
	Pattern   Pattern
	// Words says what Pattern accepts, for the message; "" names the
	// pattern alone.
	Words string
	Enum  []string
}

// String checks v against r.
func String(v any, path string, r *StringRule, iss *Issues) (string, bool) {
	s, ok := v.(string)
	if !ok {
		iss.Add(path, "must be a string, got %s", TypeName(v))
		return "", false
	}
	n := utf8.RuneCountInString(s)
	switch {
	case n < r.MinLength:
		iss.Add(path, "must be at least %d characters", r.MinLength)
		return "", false
	case r.MaxLength > 0 && n > r.MaxLength:
		iss.Add(path, "must be at most %d characters", r.MaxLength)
		return "", false
	case len(r.Enum) > 0 && !slices.Contains(r.Enum, s):
		iss.Add(path, "must be one of %s", strings.Join(r.Enum, ", "))
		return "", false
	case r.Pattern != nil && !r.Pattern.MatchString(s):
		if r.Words != "" {
			iss.Add(path, "must be %s (pattern %s)", r.Words, r.Pattern.String())
		} else {
			iss.Add(path, "must match %s", r.Pattern.String())
		}
		return "", false
	}
	return s, true
}

// Bytes checks v against r, then decodes it as base64 (RFC 4648, standard
// alphabet, padded: OpenAPI's format byte); r bounds the text, not the bytes.
func Bytes(v any, path string, r *StringRule, iss *Issues) ([]byte, bool) {
	s, ok := String(v, path, r, iss)
	if !ok {
		return nil, false
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		iss.Add(path, "must be base64 (RFC 4648, standard alphabet, padded): %s", err.Error())
		return nil, false
	}
	return b, true
}

// IntRule holds the bounds of an integer field.
type IntRule struct {
	Min, Max       int64
	HasMin, HasMax bool
}

// Int checks that v is an integer within r.
func Int(v any, path string, r *IntRule, iss *Issues) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		iss.Add(path, "must be an integer, got %s", TypeName(v))
		return 0, false
	}
	i, ok := exactInt(n.String())
	if !ok {
		iss.Add(path, "must be an integer")
		return 0, false
	}
	if r.HasMin && i < r.Min {
		iss.Add(path, "must be at least %d", r.Min)
		return 0, false
	}
	if r.HasMax && i > r.Max {
		iss.Add(path, "must be at most %d", r.Max)
		return 0, false
	}
	return i, true
}

// exactInt is the value of a JSON number literal whose value is an integer
// that fits in int64. 1.0 and 1e3 are integers written as numbers and are
// accepted; the decimal digits are read exactly, not through a float64, so
// 1.0000000000000001 and 9007199254740993.0 are not rounded into integers.
func exactInt(lit string) (int64, bool) {
	if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
		return i, true
	}
	sign := ""
	if rest, ok := strings.CutPrefix(lit, "-"); ok {
		sign, lit = "-", rest
	}
	mant, expLit, hasExp := strings.Cut(strings.ToLower(lit), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(whole+frac, "0")
	if digits == "" {
		return 0, whole+frac != "" // a zero, whatever its exponent
	}
	exp := -len(frac)
	if hasExp {
		e, err := strconv.Atoi(expLit)
		// Past these the value is above int64 or keeps a fraction; checking
		// first also keeps exp from overflowing.
		if err != nil || e > len(frac)+19 || e < -len(lit) {
			return 0, false
		}
		exp += e
	}
	// A negative exponent must only drop zeros; a positive one appends them.
	for exp < 0 && strings.HasSuffix(digits, "0") {
		digits, exp = digits[:len(digits)-1], exp+1
	}
	if exp < 0 || len(digits)+exp > 19 {
		return 0, false
	}
	i, err := strconv.ParseInt(sign+digits+strings.Repeat("0", exp), 10, 64)
	return i, err == nil
}

// FloatRule holds the bounds of a number field.
type FloatRule struct {
	Min, Max       float64
	HasMin, HasMax bool
}

// Float checks that v is a number within r.
func Float(v any, path string, r *FloatRule, iss *Issues) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		iss.Add(path, "must be a number, got %s", TypeName(v))
		return 0, false
	}
	f, err := n.Float64()
	if err != nil {
		iss.Add(path, "must be a finite number")
		return 0, false
	}
	if r.HasMin && f < r.Min {
		iss.Add(path, "must be at least %v", r.Min)
		return 0, false
	}
	if r.HasMax && f > r.Max {
		iss.Add(path, "must be at most %v", r.Max)
		return 0, false
	}
	return f, true
}

// Bool checks that v is a boolean.
func Bool(v any, path string, iss *Issues) (bool, bool) {
	b, ok := v.(bool)
	if !ok {
		iss.Add(path, "must be a boolean, got %s", TypeName(v))
	}
	return b, ok
}

// Object checks that v is an object.
func Object(v any, path string, iss *Issues) (map[string]any, bool) {
	o, ok := v.(map[string]any)
	if !ok {
		iss.Add(path, "must be an object, got %s", TypeName(v))
	}
	return o, ok
}

// CountRule bounds the entries of an array or a map and the keys of a map.
type CountRule struct {
	Min, Max   int // Max 0: unbounded
	KeyPattern Pattern
}

// Array checks that v is an array within r.
func Array(v any, path string, r *CountRule, iss *Issues) ([]any, bool) {
	a, ok := v.([]any)
	if !ok {
		iss.Add(path, "must be an array, got %s", TypeName(v))
		return nil, false
	}
	if len(a) < r.Min {
		iss.Add(path, "must have at least %d items", r.Min)
		return nil, false
	}
	if r.Max > 0 && len(a) > r.Max {
		iss.Add(path, "must have at most %d items", r.Max)
		return nil, false
	}
	return a, true
}

// Map checks that v is an object used as a map within r and returns its keys
// sorted, so values are checked in a stable order.
func Map(v any, path string, r *CountRule, iss *Issues) (map[string]any, []string, bool) {
	o, ok := v.(map[string]any)
	if !ok {
		iss.Add(path, "must be an object, got %s", TypeName(v))
		return nil, nil, false
	}
	if r.Max > 0 && len(o) > r.Max {
		iss.Add(path, "must have at most %d entries", r.Max)
		return nil, nil, false
	}
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	good := true
	if r.KeyPattern != nil {
		for _, k := range keys {
			if !r.KeyPattern.MatchString(k) {
				iss.Add(Join(path, k), "key must match %s", r.KeyPattern.String())
				good = false
			}
		}
	}
	return o, keys, good
}

// ExactlyOne records an issue unless exactly one of the named fields is
// present (and not null) in obj.
func ExactlyOne(obj map[string]any, path string, names []string, iss *Issues) {
	n := 0
	for _, k := range names {
		if v, ok := obj[k]; ok && v != nil {
			n++
		}
	}
	if n != 1 {
		iss.Add(path, "exactly one of %s is required", strings.Join(names, ", "))
	}
}

// Nullable is an input field that tells absent, null and a value apart.
type Nullable[T any] struct {
	Present bool // the field was in the input
	Null    bool // it was null
	Value   T
}

// Set reports whether a value (not null) was given.
func (n Nullable[T]) Set() bool { return n.Present && !n.Null }

// MarshalJSON writes null or the value.
func (n Nullable[T]) MarshalJSON() ([]byte, error) {
	if !n.Set() {
		return []byte("null"), nil
	}
	return json.Marshal(n.Value)
}

// TimeLayout is how the API writes times: RFC 3339 in UTC with
// milliseconds (ARCHITECTURE.md, "JSON field names").
const TimeLayout = "2006-01-02T15:04:05.000Z"

// Time writes t as the API does.
func Time(t time.Time) string { return t.UTC().Format(TimeLayout) }

// EncodeAny writes v with encoding/json: what the generated encoders use
// for values the catalog does not type (any, free-form objects) and for
// maps, whose keys encoding/json sorts and escapes.
func EncodeAny(e *jx.Encoder, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	e.Raw(b)
	return nil
}
