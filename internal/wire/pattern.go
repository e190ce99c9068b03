package wire

import (
	"regexp"
	"regexp/syntax"
	"slices"
	"unicode/utf8"
)

// Pattern is a compiled field pattern: *regexp.Regexp, or the compact
// matcher MustPattern builds for the anchored shapes the catalog uses.
type Pattern interface {
	MatchString(s string) bool
	String() string
}

// MustPattern compiles src, a pattern of the catalog, and panics if it is
// not valid RE2 syntax (the catalog's loader rejects such a pattern first).
//
// Most of the catalog's patterns are ^...$ over single-character classes
// with bounded counts ("^site_[0-9a-hjkmnp-tv-z]{26,52}$"). regexp expands
// each count into as many instructions and keeps a one-pass copy of them:
// about 1.3 MiB of pointers for the catalog, which every collection of the
// api process marks again (docs/benchmarks-notes.md, "The collector's
// mark"). Such a pattern is matched here by its length and classes
// instead, in a few hundred bytes; any other pattern is a regexp.
func MustPattern(src string) Pattern {
	p, err := CompilePattern(src)
	if err != nil {
		panic(err)
	}
	return p
}

// CompilePattern is MustPattern answering an error, regexp.Compile's own.
func CompilePattern(src string) (Pattern, error) {
	re, err := syntax.Parse(src, syntax.Perl) // what regexp.Compile parses with
	if err != nil {
		return nil, err
	}
	if sh, ok := shapeOf(src, re); ok {
		return sh, nil
	}
	compiled, err := regexp.Compile(src)
	if err != nil {
		return nil, err
	}
	return compiled, nil
}

// shape matches ^(alt|alt...)$ where each alternative is a sequence of
// single-character classes, each taken a number of times within a range.
// An alternative is matched in one pass, with no backtracking, exactly as
// the regexp would, in one of two ways:
//   - by length: at most one element's count varies, so the string's length
//     in runes fixes it;
//   - greedily: each element whose count varies is the last, or is followed
//     by an element of at least one character from a class disjoint from
//     its own, so its run ends at the first character outside its class.
type shape struct {
	src  string
	alts []shapeSeq
}

type shapeSeq struct {
	elems  []shapeElem
	fixed  int  // runes taken by the elements of fixed count
	vary   int  // by length: the element whose count varies, -1 if none
	greedy bool // matched greedily, not by length
}

type shapeElem struct {
	class    runeClass
	min, max int // max -1: unbounded
}

// runeClass is a set of runes: a bitmap for ASCII, sorted ranges above.
type runeClass struct {
	ascii [2]uint64
	high  []rune // pairs lo, hi, each >= utf8.RuneSelf
}

func (c *runeClass) has(r rune) bool {
	if r < utf8.RuneSelf {
		return c.ascii[r>>6]&(1<<(r&63)) != 0
	}
	for i := 0; i+1 < len(c.high); i += 2 {
		if r < c.high[i] {
			return false
		}
		if r <= c.high[i+1] {
			return true
		}
	}
	return false
}

func (c *runeClass) disjoint(d *runeClass) bool {
	if c.ascii[0]&d.ascii[0] != 0 || c.ascii[1]&d.ascii[1] != 0 {
		return false
	}
	for i := 0; i+1 < len(c.high); i += 2 {
		for j := 0; j+1 < len(d.high); j += 2 {
			if c.high[i] <= d.high[j+1] && d.high[j] <= c.high[i+1] {
				return false
			}
		}
	}
	return true
}

// classOf builds a runeClass from syntax's sorted range pairs.
func classOf(pairs []rune) runeClass {
	var c runeClass
	for i := 0; i+1 < len(pairs); i += 2 {
		lo, hi := pairs[i], pairs[i+1]
		for r := lo; r <= hi && r < utf8.RuneSelf; r++ {
			c.ascii[r>>6] |= 1 << (r & 63)
		}
		if hi >= utf8.RuneSelf {
			c.high = append(c.high, max(lo, utf8.RuneSelf), hi)
		}
	}
	return c
}

// maxShapeAlts bounds the alternatives a shape may expand to; a pattern
// that needs more stays a regexp.
const maxShapeAlts = 8

// shapeOf reports the shape of re, if it has one.
func shapeOf(src string, re *syntax.Regexp) (*shape, bool) {
	if re.Op != syntax.OpConcat || len(re.Sub) < 2 ||
		re.Sub[0].Op != syntax.OpBeginText || re.Sub[len(re.Sub)-1].Op != syntax.OpEndText {
		return nil, false
	}
	alts, ok := seqsOf(&syntax.Regexp{Op: syntax.OpConcat, Sub: re.Sub[1 : len(re.Sub)-1]})
	if !ok {
		return nil, false
	}
	sh := &shape{src: src}
	for _, elems := range alts {
		seq := shapeSeq{elems: elems, vary: -1}
		for i, e := range elems {
			seq.fixed += e.min
			if e.min == e.max {
				continue
			}
			if seq.vary >= 0 {
				seq.greedy = true // two counts that vary: the length does not fix them
			}
			seq.vary = i
		}
		if seq.greedy && !delimited(elems) {
			return nil, false
		}
		sh.alts = append(sh.alts, seq)
	}
	return sh, true
}

// seqsOf expands re into its alternatives, each a sequence of elements.
func seqsOf(re *syntax.Regexp) ([][]shapeElem, bool) {
	if re.Flags&syntax.FoldCase != 0 {
		return nil, false
	}
	switch re.Op {
	case syntax.OpEmptyMatch:
		return [][]shapeElem{nil}, true
	case syntax.OpLiteral:
		seq := make([]shapeElem, len(re.Rune))
		for i, r := range re.Rune {
			seq[i] = shapeElem{class: classOf([]rune{r, r}), min: 1, max: 1}
		}
		return [][]shapeElem{seq}, true
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		c, _ := oneChar(re)
		return [][]shapeElem{{{class: c, min: 1, max: 1}}}, true
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		lo, hi := countOf(re)
		if c, ok := oneChar(re.Sub[0]); ok {
			return [][]shapeElem{{{class: c, min: lo, max: hi}}}, true
		}
		if re.Op != syntax.OpQuest {
			return nil, false
		}
		inner, ok := seqsOf(re.Sub[0]) // (...)? : nothing, or the group
		if !ok {
			return nil, false
		}
		return capAlts(append([][]shapeElem{nil}, inner...))
	case syntax.OpCapture:
		return seqsOf(re.Sub[0])
	case syntax.OpAlternate:
		var all [][]shapeElem
		for _, sub := range re.Sub {
			alts, ok := seqsOf(sub)
			if !ok {
				return nil, false
			}
			all = append(all, alts...)
		}
		return capAlts(all)
	case syntax.OpConcat:
		all := [][]shapeElem{nil}
		for _, sub := range re.Sub {
			alts, ok := seqsOf(sub)
			if !ok {
				return nil, false
			}
			var next [][]shapeElem
			for _, head := range all {
				for _, tail := range alts {
					next = append(next, append(slices.Clip(head), tail...))
				}
			}
			if all, ok = capAlts(next); !ok {
				return nil, false
			}
		}
		return all, true
	}
	return nil, false
}

// delimited reports whether every element of varying count in elems ends
// where its class does: it is the last, or the next element takes at least
// one character of a class disjoint from its own.
func delimited(elems []shapeElem) bool {
	for i, e := range elems[:len(elems)-1] {
		next := &elems[i+1]
		if e.min != e.max && (next.min == 0 || !e.class.disjoint(&next.class)) {
			return false
		}
	}
	return true
}

func capAlts(alts [][]shapeElem) ([][]shapeElem, bool) {
	return alts, len(alts) <= maxShapeAlts
}

// oneChar reports the class of re when re matches exactly one character.
func oneChar(re *syntax.Regexp) (runeClass, bool) {
	if re.Flags&syntax.FoldCase != 0 {
		return runeClass{}, false
	}
	switch re.Op {
	case syntax.OpLiteral:
		if len(re.Rune) == 1 {
			return classOf([]rune{re.Rune[0], re.Rune[0]}), true
		}
	case syntax.OpCharClass:
		return classOf(re.Rune), true
	case syntax.OpAnyChar:
		return classOf([]rune{0, utf8.MaxRune}), true
	case syntax.OpAnyCharNotNL:
		return classOf([]rune{0, '\n' - 1, '\n' + 1, utf8.MaxRune}), true
	}
	return runeClass{}, false
}

func countOf(re *syntax.Regexp) (lo, hi int) {
	switch re.Op {
	case syntax.OpStar:
		return 0, -1
	case syntax.OpPlus:
		return 1, -1
	case syntax.OpQuest:
		return 0, 1
	}
	return re.Min, re.Max
}

func (sh *shape) String() string { return sh.src }

// MatchString reports whether s matches the whole pattern.
func (sh *shape) MatchString(s string) bool {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			n = utf8.RuneCountInString(s)
			break
		}
	}
	for i := range sh.alts {
		if sh.alts[i].match(s, n) {
			return true
		}
	}
	return false
}

// match reports whether s, of n runes, matches the sequence.
func (q *shapeSeq) match(s string, n int) bool {
	if q.greedy {
		return q.matchGreedy(s)
	}
	varying := 0
	if q.vary < 0 {
		if n != q.fixed {
			return false
		}
	} else {
		e := &q.elems[q.vary]
		varying = n - q.fixed + e.min
		if varying < e.min || (e.max >= 0 && varying > e.max) {
			return false
		}
	}
	pos := 0
	for i := range q.elems {
		e := &q.elems[i]
		count := e.min
		if i == q.vary {
			count = varying
		}
		for range count {
			r, w := nextRune(s, pos)
			if !e.class.has(r) {
				return false
			}
			pos += w
		}
	}
	return true
}

// matchGreedy takes each element's run while its class lasts, up to its
// count's maximum; delimited makes that the only way to match.
func (q *shapeSeq) matchGreedy(s string) bool {
	pos := 0
	for i := range q.elems {
		e := &q.elems[i]
		count := 0
		for pos < len(s) && (e.max < 0 || count < e.max) {
			r, w := nextRune(s, pos)
			if !e.class.has(r) {
				break
			}
			pos += w
			count++
		}
		if count < e.min {
			return false
		}
	}
	return pos == len(s)
}

// nextRune decodes the rune at s[pos:], as regexp does: an invalid byte is
// utf8.RuneError, one byte wide.
func nextRune(s string, pos int) (rune, int) {
	if r := rune(s[pos]); r < utf8.RuneSelf {
		return r, 1
	}
	return utf8.DecodeRuneInString(s[pos:])
}
