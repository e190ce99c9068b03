package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Output formats.
const (
	OutputTable = "table"
	OutputJSON  = "json"
)

// WriteOutput prints the data of an answer. json: the data as the server
// wrote it, indented. table: an object as KEY VALUE rows (nested objects
// flattened to dotted keys, arrays as compact JSON, null as -); an object
// with an items array of objects (a list) as a table of the items' scalar
// fields, a header row first, followed by the object's other fields as
// KEY VALUE rows. Fields keep the server's order, so the output is as
// deterministic as the answer.
func WriteOutput(w io.Writer, format string, data []byte) error {
	switch format {
	case OutputJSON:
		var buf bytes.Buffer
		if err := json.Indent(&buf, data, "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return err
	case OutputTable:
		v, err := parseOrdered(data)
		if err != nil {
			return err
		}
		return writeTable(w, v)
	default:
		return fmt.Errorf("unknown output format %q", format)
	}
}

func writeTable(w io.Writer, v *value) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	switch {
	case v.kind != kindObject:
		fmt.Fprintln(tw, cell(v))
	case v.isList():
		items := v.get("items")
		cols := columns(items.elems)
		if len(cols) == 0 {
			fmt.Fprintln(tw, "(no items)")
		} else {
			fmt.Fprintln(tw, strings.Join(cols, "\t"))
		}
		for _, it := range items.elems {
			row := make([]string, len(cols))
			for i, c := range cols {
				row[i] = "-"
				if f := it.get(c); f != nil {
					row[i] = cut(summary(f), MaxColumn)
				}
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		rest := &value{kind: kindObject}
		for i, k := range v.keys {
			if k != "items" {
				rest.keys = append(rest.keys, k)
				rest.vals = append(rest.vals, v.vals[i])
			}
		}
		if len(rest.keys) > 0 {
			fmt.Fprintln(tw)
			writeRows(tw, "", rest)
		}
	default:
		writeRows(tw, "", v)
	}
	return tw.Flush()
}

// writeRows writes one KEY VALUE row per scalar, flattening objects.
func writeRows(w io.Writer, prefix string, obj *value) {
	for i, k := range obj.keys {
		v := obj.vals[i]
		if v.kind == kindObject && len(v.keys) > 0 {
			writeRows(w, prefix+k+".", v)
			continue
		}
		fmt.Fprintf(w, "%s%s\t%s\n", prefix, k, cell(v))
	}
}

// columns are the fields of any item, in first-seen order: scalars as they
// are, nested values summarised (summary).
func columns(items []*value) []string {
	var cols []string
	seen := map[string]bool{}
	for _, it := range items {
		for _, k := range it.keys {
			if !seen[k] {
				seen[k] = true
				cols = append(cols, k)
			}
		}
	}
	return cols
}

// MaxColumn is the widest a table cell of a list gets; longer values are
// cut with an ellipsis (--output json shows them whole).
const MaxColumn = 40

// summary is a value in a list's cell: a nested array as its length, a
// nested object as its keys.
func summary(v *value) string {
	switch v.kind {
	case kindArray:
		if len(v.elems) == 1 {
			return "[1 item]"
		}
		return "[" + strconv.Itoa(len(v.elems)) + " items]"
	case kindObject:
		if len(v.keys) == 0 {
			return "{}"
		}
		return "{" + strings.Join(v.keys, ", ") + "}"
	}
	return cell(v)
}

// cut shortens s to at most n characters, ending in an ellipsis.
func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// cell is a value in one table cell.
func cell(v *value) string {
	switch v.kind {
	case kindNull:
		return "-"
	case kindString:
		if strings.ContainsAny(v.str, "\t\n\r") || v.str == "" {
			return strconv.Quote(v.str)
		}
		return v.str
	case kindArray, kindObject:
		return string(v.compact())
	default:
		return string(v.raw)
	}
}

type kind int

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

// value is a JSON value that keeps the order of object keys.
type value struct {
	kind  kind
	str   string          // strings
	raw   json.RawMessage // numbers, booleans and null
	keys  []string        // objects
	vals  []*value        // objects
	elems []*value        // arrays
}

func (v *value) get(key string) *value {
	for i, k := range v.keys {
		if k == key {
			return v.vals[i]
		}
	}
	return nil
}

func (v *value) scalar() bool { return v.kind != kindArray && v.kind != kindObject }

// isList: an object whose items is an array of objects.
func (v *value) isList() bool {
	items := v.get("items")
	if items == nil || items.kind != kindArray {
		return false
	}
	for _, e := range items.elems {
		if e.kind != kindObject {
			return false
		}
	}
	return true
}

func parseOrdered(data []byte) (*value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("trailing data after the answer")
	}
	return v, nil
}

func parseValue(dec *json.Decoder) (*value, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := &value{kind: kindObject}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key, _ := kt.(string)
				child, err := parseValue(dec)
				if err != nil {
					return nil, err
				}
				v.keys = append(v.keys, key)
				v.vals = append(v.vals, child)
			}
			if _, err := dec.Token(); err != nil { // '}'
				return nil, err
			}
			return v, nil
		case '[':
			v := &value{kind: kindArray}
			for dec.More() {
				child, err := parseValue(dec)
				if err != nil {
					return nil, err
				}
				v.elems = append(v.elems, child)
			}
			if _, err := dec.Token(); err != nil { // ']'
				return nil, err
			}
			return v, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case string:
		return &value{kind: kindString, str: t}, nil
	case json.Number:
		return &value{kind: kindNumber, raw: json.RawMessage(t.String())}, nil
	case bool:
		return &value{kind: kindBool, raw: json.RawMessage(strconv.FormatBool(t))}, nil
	case nil:
		return &value{kind: kindNull, raw: json.RawMessage("null")}, nil
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

// compact writes an object or array back as compact JSON in its order.
func (v *value) compact() json.RawMessage {
	var b bytes.Buffer
	var write func(*value)
	write = func(v *value) {
		switch v.kind {
		case kindString:
			b.Write(jsonString(v.str))
		case kindObject:
			b.WriteByte('{')
			for i, k := range v.keys {
				if i > 0 {
					b.WriteByte(',')
				}
				b.Write(jsonString(k))
				b.WriteByte(':')
				write(v.vals[i])
			}
			b.WriteByte('}')
		case kindArray:
			b.WriteByte('[')
			for i, e := range v.elems {
				if i > 0 {
					b.WriteByte(',')
				}
				write(e)
			}
			b.WriteByte(']')
		default:
			b.Write(v.raw)
		}
	}
	write(v)
	return b.Bytes()
}

// jsonString is s as a JSON string, without escaping <, > and &.
func jsonString(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
