package wire

import (
	"encoding/json"
	"unicode/utf8"
)

// parseFast is ParseObject's single pass for the common case: a valid body
// that ParseObject accepts. It builds the same tree (json.Number for
// numbers) while checking duplicate keys, NUL and nesting as it goes, and
// gives up (ok false) on anything else: malformed JSON, a duplicate key, a
// NUL, nesting at MaxDepth, a \u escape of a surrogate (which
// encoding/json mends with U+FFFD), something after the object. ParseObject
// then runs the two passes of encoding/json, so every refusal and its
// message stay exactly theirs; FuzzParseFastMatches holds the two to the
// same trees. The body is valid UTF-8 (checked before).
func parseFast(body []byte) (map[string]any, bool) {
	p := fastParser{b: body}
	p.space()
	if p.i >= len(p.b) || p.b[p.i] != '{' {
		return nil, false
	}
	obj, ok := p.object(0)
	if !ok {
		return nil, false
	}
	p.space()
	return obj, p.i == len(p.b)
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses the value at p.i; depth is that of its container.
func (p *fastParser) value(depth int) (any, bool) {
	if p.i >= len(p.b) {
		return nil, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		if depth+1 >= MaxDepth {
			return nil, false
		}
		return p.object(depth + 1)
	case c == '[':
		if depth+1 >= MaxDepth {
			return nil, false
		}
		return p.array(depth + 1)
	case c == '"':
		return p.str()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	}
	return nil, false
}

func (p *fastParser) literal(word string) bool {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return false
	}
	p.i += len(word)
	return true
}

// object parses {...} at p.i, at nesting depth.
func (p *fastParser) object(depth int) (map[string]any, bool) {
	p.i++ // {
	obj := map[string]any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return obj, true
	}
	for {
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, false
		}
		key, ok := p.str()
		if !ok {
			return nil, false
		}
		if _, dup := obj[key]; dup {
			return nil, false
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, false
		}
		p.i++
		p.space()
		v, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		obj[key] = v
		p.space()
		if p.i >= len(p.b) {
			return nil, false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
			p.space()
		case '}':
			p.i++
			return obj, true
		default:
			return nil, false
		}
	}
}

func (p *fastParser) array(depth int) (any, bool) {
	p.i++ // [
	list := []any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return list, true
	}
	for {
		v, ok := p.value(depth)
		if !ok {
			return nil, false
		}
		list = append(list, v)
		p.space()
		if p.i >= len(p.b) {
			return nil, false
		}
		switch p.b[p.i] {
		case ',':
			p.i++
			p.space()
		case ']':
			p.i++
			return list, true
		default:
			return nil, false
		}
	}
}

// str parses a string at p.i (its opening quote).
func (p *fastParser) str() (string, bool) {
	p.i++ // "
	start := p.i
	// Fast path: no escape.
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := string(p.b[start:p.i])
			p.i++
			return s, true
		case c == '\\':
			return p.strEscaped(start)
		case c < 0x20: // control characters (NUL among them) are invalid raw
			return "", false
		}
		p.i++
	}
	return "", false
}

func (p *fastParser) strEscaped(start int) (string, bool) {
	out := append(make([]byte, 0, p.i-start+16), p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return string(out), true
		case c < 0x20:
			return "", false
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			return "", false
		}
		e := p.b[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			// NUL is refused by name, and surrogates are mended by
			// encoding/json: both are the slow path's.
			if !ok || r == 0 || r >= 0xd800 && r < 0xe000 {
				return "", false
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", false
		}
	}
	return "", false
}

func (p *fastParser) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	p.i += 4
	return r, true
}

// number parses -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? and keeps
// its text, as json.Decoder.UseNumber does.
func (p *fastParser) number() (any, bool) {
	start := p.i
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case p.digits() == 0:
		return nil, false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return nil, false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return nil, false
		}
	}
	return json.Number(p.b[start:p.i]), true
}

func (p *fastParser) digits() int {
	n := 0
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}
