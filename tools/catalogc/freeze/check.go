package freeze

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"computeplane/tools/catalogc/catalog"
)

// Violation is a frozen line the catalog no longer honours.
type Violation struct {
	Line int    // 1-based line of the surface file
	Text string // the frozen line
	Why  string
}

func (v Violation) String() string { return fmt.Sprintf("%d: %s: %s", v.Line, v.Text, v.Why) }

// Check compares the lines of the surface file with the catalog and returns
// every narrowing, ordered by line. Widening passes: looser or dropped
// bounds, new optional fields, new enum values, new methods and codes, and
// any change to a planned method.
func Check(lines []string, c *catalog.Catalog) []Violation {
	cur := map[string]*Line{}
	for _, s := range Surface(c) {
		l, err := ParseLine(s)
		if err != nil {
			panic(fmt.Sprintf("freeze: Surface wrote an unparsable line %q: %v", s, err))
		}
		cur[l.Key] = l
	}
	ck := &checker{cat: c, cur: cur, frozenKeys: map[string]bool{},
		frozenTypes: map[string]map[string]bool{}, goneMethods: map[string]bool{}}
	type numbered struct {
		n    int
		text string
		l    *Line
	}
	var frozen []numbered
	for i, text := range lines {
		text = strings.TrimSpace(text)
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		l, err := ParseLine(text)
		if err != nil {
			ck.add(i+1, text, "unreadable line: "+err.Error())
			continue
		}
		frozen = append(frozen, numbered{i + 1, text, l})
		ck.frozenKeys[l.Key] = true
		if t, ok := l.Attrs["type"]; ok {
			if ck.frozenTypes[l.Key] == nil {
				ck.frozenTypes[l.Key] = map[string]bool{}
			}
			ck.frozenTypes[l.Key][t] = true
		}
	}
	// Methods first, so the fields of a gone method are not each reported.
	methodLine := map[string]int{}
	for _, f := range frozen {
		if f.l.Kind == KindMethod {
			methodLine[f.l.Key] = f.n
			ck.method(f.n, f.text, f.l)
		}
	}
	for _, f := range frozen {
		switch f.l.Kind {
		case KindField:
			ck.field(f.n, f.text, f.l)
		case KindError:
			ck.errorCode(f.n, f.text, f.l)
		}
	}
	// New required fields of frozen methods whose parent was frozen.
	var keys []string
	for k := range cur {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		l := cur[k]
		if l.Kind != KindField || ck.frozenKeys[k] || l.Attrs["required"] != "true" {
			continue
		}
		m, path := splitFieldKey(k)
		n, ok := methodLine[m]
		parent, hasParent := parentPath(path)
		if !ok || !hasParent || !ck.frozenKeys[m+"."+parent] {
			continue
		}
		ck.add(n, strings.TrimSpace(lines[n-1]), "new required input field "+path)
	}
	slices.SortStableFunc(ck.out, func(a, b Violation) int { return a.Line - b.Line })
	return ck.out
}

type checker struct {
	cat         *catalog.Catalog
	cur         map[string]*Line
	frozenKeys  map[string]bool
	frozenTypes map[string]map[string]bool // types recorded for a field key
	goneMethods map[string]bool            // reported once, on the method line
	out         []Violation
}

func (ck *checker) add(n int, text, why string) {
	ck.out = append(ck.out, Violation{Line: n, Text: text, Why: why})
}

func (ck *checker) method(n int, text string, l *Line) {
	now := ck.cur[l.Key]
	if now == nil {
		ck.goneMethods[l.Key] = true
		if m := ck.cat.Method(l.Key); m != nil {
			ck.add(n, text, fmt.Sprintf("served method is no longer registered (status %s)", m.Status))
		} else {
			ck.add(n, text, "served method is gone")
		}
		return
	}
	for _, a := range []string{"route", "kind", "action", "resource"} {
		if l.Attrs[a] != now.Attrs[a] {
			ck.add(n, text, fmt.Sprintf("%s changed from %s to %s", a, quote(l.Attrs[a]), quote(now.Attrs[a])))
		}
	}
}

func (ck *checker) errorCode(n int, text string, l *Line) {
	now := ck.cur[l.Key]
	switch {
	case now == nil:
		ck.add(n, text, "error code is gone")
	case now.Attrs["status"] != l.Attrs["status"]:
		ck.add(n, text, fmt.Sprintf("HTTP status changed from %s to %s", l.Attrs["status"], now.Attrs["status"]))
	}
}

func (ck *checker) field(n int, text string, l *Line) {
	m, path := splitFieldKey(l.Key)
	if ck.goneMethods[m] {
		return // reported once, on the method line
	}
	now := ck.cur[l.Key]
	if now == nil {
		if ck.cur[m] == nil {
			ck.add(n, text, "the method of this field is not served")
			return
		}
		ck.gone(n, text, m, path)
		return
	}
	from, to := l.Attrs["type"], now.Attrs["type"]
	if from != to {
		if !widerType(from, to) {
			ck.add(n, text, fmt.Sprintf("type changed from %s to %s", from, to))
		}
		return // bounds of different types do not compare
	}
	if l.Attrs["required"] == "false" && now.Attrs["required"] == "true" {
		ck.add(n, text, "became required")
	}
	// Lower bounds: raised or newly added is narrowing.
	for _, k := range []string{"minLength", "minimum", "minItems"} {
		ck.bound(n, text, l, now, k, false)
	}
	// Upper bounds: lowered or newly added is narrowing.
	for _, k := range []string{"maxLength", "maximum", "maxItems", "maxEntries"} {
		ck.bound(n, text, l, now, k, true)
	}
	// Anything else that constrains a value: changed or newly added.
	for _, k := range []string{"pattern", "keyPattern", "format", "exactlyOne"} {
		was, had := l.Attrs[k]
		is, has := now.Attrs[k]
		switch {
		case has && !had:
			ck.add(n, text, fmt.Sprintf("%s %s was added", k, quote(is)))
		case has && is != was:
			ck.add(n, text, fmt.Sprintf("%s changed from %s to %s", k, quote(was), quote(is)))
		}
	}
	if is, has := now.Attrs["enum"]; has {
		if was, had := l.Attrs["enum"]; !had {
			ck.add(n, text, "enum "+is+" was added")
		} else {
			values := strings.Split(is, ",")
			var lost []string
			for _, v := range strings.Split(was, ",") {
				if !slices.Contains(values, v) {
					lost = append(lost, v)
				}
			}
			if len(lost) > 0 {
				ck.add(n, text, "enum lost "+strings.Join(lost, ","))
			}
		}
	}
	if l.Attrs["nullable"] == "true" && now.Attrs["nullable"] != "true" {
		ck.add(n, text, "no longer nullable")
	}
}

// gone reports a frozen field that is no longer there. A removed input
// field narrows: a request that sends it now fails as an unknown field.
// Only the outermost gone field is reported, and none when what held it
// now accepts anything or changed type (reported on its own line).
func (ck *checker) gone(n int, text, method, path string) {
	parent, ok := parentPath(path)
	if !ok {
		ck.add(n, text, "input field is gone")
		return
	}
	key := method + "." + parent
	holder := ck.cur[key]
	if holder == nil {
		return // the holder is gone too and reported itself
	}
	t := holder.Attrs["type"]
	if t == catalog.TAny || t == typeFreeForm || !ck.frozenTypes[key][t] {
		return
	}
	ck.add(n, text, "input field is gone (a request that sends it now fails as an unknown field)")
}

func (ck *checker) bound(n int, text string, was, is *Line, k string, upper bool) {
	wv, had := was.Attrs[k]
	iv, has := is.Attrs[k]
	if !has {
		return // dropped: wider
	}
	if !had {
		ck.add(n, text, fmt.Sprintf("%s %s was added", k, iv))
		return
	}
	w, err1 := strconv.ParseFloat(wv, 64)
	i, err2 := strconv.ParseFloat(iv, 64)
	if err1 != nil || err2 != nil {
		ck.add(n, text, fmt.Sprintf("%s is not a number", k))
		return
	}
	switch {
	case upper && i < w:
		ck.add(n, text, fmt.Sprintf("%s lowered from %s to %s", k, wv, iv))
	case !upper && i > w:
		ck.add(n, text, fmt.Sprintf("%s raised from %s to %s", k, wv, iv))
	}
}

// widerType reports whether a field of type from may now be of type to
// without refusing a value it accepted.
func widerType(from, to string) bool {
	switch to {
	case catalog.TAny:
		return true
	case catalog.TNumber:
		return from == catalog.TInteger
	case typeFreeForm:
		return from == typeObject || from == catalog.TMap
	}
	return false
}

// splitFieldKey splits "sites.create.input.warm.min" into the method
// "sites.create" and the path "input.warm.min".
func splitFieldKey(key string) (method, path string) {
	parts := strings.SplitN(key, ".", 3)
	if len(parts) < 3 {
		return key, ""
	}
	return parts[0] + "." + parts[1], parts[2]
}

// parentPath is the path holding path: input.volumes[].mountPath ->
// input.volumes[] -> input.volumes -> input.
func parentPath(path string) (string, bool) {
	switch {
	case strings.HasSuffix(path, "[]"), strings.HasSuffix(path, "{}"):
		return path[:len(path)-2], true
	}
	i := strings.LastIndexByte(path, '.')
	if i < 0 {
		return "", false
	}
	return path[:i], true
}
