package catalog

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Files of a catalog directory that are not groups.
const (
	ShapesFile = "shapes.yaml"
	ErrorsFile = "errors.yaml"
	EventsFile = "events.yaml"
	MetersFile = "meters.yaml"
)

// MethodsSuffix ends the name of a group file that cannot be <group>.yaml
// because that name is taken: the events group lives in events.methods.yaml
// beside the event catalog events.yaml. The group's name is the part before
// the suffix.
const MethodsSuffix = ".methods.yaml"

var (
	identRe    = regexp.MustCompile(`^[a-z][A-Za-z0-9]*$`)
	typeRe     = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	codeRe     = regexp.MustCompile(`^[A-Z][A-Z_]*[A-Z]$`)
	actionRe   = regexp.MustCompile(`^compute:[a-z][a-z0-9-]{0,63}:[a-z][a-z0-9-]{0,63}$`)
	phaseRe    = regexp.MustCompile(`^(v[0-9]+\.[0-9]+|none)$`)
	resTypRe   = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	idPrefixRe = regexp.MustCompile(`^\^([a-z]+)_`)
	eventRe    = regexp.MustCompile(`^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)+$`)
	// pluginRe is a plugin id: a route segment, an action's middle part and
	// a Go identifier stem at once, hence narrower than the configuration's
	// RuntimeName.
	pluginRe = regexp.MustCompile(`^[a-z][a-z0-9]{0,31}$`)

	yamlLineRe = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)
)

// PluginsGlob finds the plugin catalogs built with the service, relative
// to the repository root.
const PluginsGlob = "plugins/*/catalog"

// LoadWithPlugins loads dir with every plugin catalog glob matches, in
// name order.
func LoadWithPlugins(dir, glob string) (*Catalog, error) {
	var plugins []string
	if glob != "" {
		var err error
		if plugins, err = filepath.Glob(glob); err != nil {
			return nil, err
		}
		slices.Sort(plugins)
	}
	return Load(dir, plugins...)
}

// Load reads every catalog file of dir and checks it. Each of plugins is
// the catalog directory of an out-of-process plugin (plugins/<id>/catalog,
// docs/plugins.md): its group files and its events.yaml join the catalog
// under the plugin's id, with the shapes and error codes of dir.
func Load(dir string, plugins ...string) (*Catalog, error) {
	c := &Catalog{shapes: map[string]*Shape{}, types: map[string]*NamedType{}}
	if err := c.loadShapes(filepath.Join(dir, ShapesFile)); err != nil {
		return nil, err
	}
	if err := c.loadErrors(filepath.Join(dir, ErrorsFile)); err != nil {
		return nil, err
	}
	type source struct{ dir, plugin string }
	sources := []source{{dir: dir}}
	for _, p := range plugins {
		id := filepath.Base(filepath.Dir(filepath.Clean(p)))
		if !pluginRe.MatchString(id) {
			return nil, errAt(Pos{p, 1}, "plugin id %q (the directory above catalog/) must be 1 to 32 characters of a-z and 0-9, starting with a letter", id)
		}
		sources = append(sources, source{dir: p, plugin: id})
	}
	var groupNodes []*yaml.Node
	for _, src := range sources {
		files, err := filepath.Glob(filepath.Join(src.dir, "*.yaml"))
		if err != nil {
			return nil, err
		}
		slices.Sort(files)
		for _, f := range files {
			switch filepath.Base(f) {
			case ShapesFile, ErrorsFile, EventsFile, MetersFile:
				if src.plugin != "" && filepath.Base(f) != EventsFile {
					return nil, errAt(Pos{f, 1}, "a plugin catalog holds group files and events.yaml only; shapes, errors and meters are the service's")
				}
				continue
			}
			root, err := parseFile(f)
			if err != nil {
				return nil, err
			}
			g, err := c.declareGroup(f, root, src.plugin)
			if err != nil {
				return nil, err
			}
			c.Groups = append(c.Groups, g)
			groupNodes = append(groupNodes, root)
		}
	}
	var err error
	// Types first, in every group, so refs may cross groups: every name is
	// declared before any schema is read.
	typeDefs := make([][]node, len(c.Groups))
	for i, g := range c.Groups {
		if typeDefs[i], err = c.declareTypes(g, groupNodes[i]); err != nil {
			return nil, err
		}
	}
	for i, g := range c.Groups {
		for j, t := range g.Types {
			if t.Schema, err = c.objectSchema(typeDefs[i][j], false); err != nil {
				return nil, err
			}
		}
	}
	for i, g := range c.Groups {
		if err := c.loadMethods(g, groupNodes[i]); err != nil {
			return nil, err
		}
	}
	for _, src := range sources {
		if _, err := os.Stat(filepath.Join(src.dir, EventsFile)); err == nil {
			if err := c.loadEvents(filepath.Join(src.dir, EventsFile), src.plugin); err != nil {
				return nil, err
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, MetersFile)); err == nil {
		if err := c.loadMeters(filepath.Join(dir, MetersFile)); err != nil {
			return nil, err
		}
	}
	if err := c.checkMethods(); err != nil {
		return nil, err
	}
	return c, nil
}

// meterRe is the specification's MeterName.
var meterRe = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,127}$`)

func (c *Catalog) loadMeters(path string) error {
	root, err := parseFile(path)
	if err != nil {
		return err
	}
	keys, vals, err := node{file: path, n: root}.pairs("meters")
	if err != nil {
		return err
	}
	for i, name := range keys {
		v := vals[i]
		if !meterRe.MatchString(name) {
			return v.nameErrf("meter %q is not a MeterName", name)
		}
		m := &Meter{Name: name, Pos: v.at()}
		ks, vs, err := v.pairs("meter "+name, "unit", "module", "description")
		if err != nil {
			return err
		}
		for j, k := range ks {
			switch k {
			case "unit":
				m.Unit, err = vs[j].str("unit")
			case "module":
				m.Module, err = vs[j].str("module")
			case "description":
				m.Description, err = vs[j].str("description")
			}
			if err != nil {
				return err
			}
		}
		if m.Unit == "" || m.Module == "" {
			return v.nameErrf("meter %s needs a unit and a module", name)
		}
		c.Meters = append(c.Meters, m)
	}
	return nil
}

func parseFile(path string) (*yaml.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		// yaml.v3 says "yaml: line N: message"; report it as file:N: message.
		if m := yamlLineRe.FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, errAt(Pos{path, line}, "%s", m[2])
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, errAt(Pos{path, 1}, "expected one YAML document")
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, errAt(Pos{path, root.Line}, "expected a mapping at the top")
	}
	return root, nil
}

// node is a YAML node with the file it came from and, for a mapping value,
// the key that names it.
type node struct {
	file string
	n    *yaml.Node
	key  *yaml.Node
}

func (n node) pos() Pos { return Pos{n.file, n.n.Line} }

// at is where the element is named: the line of its key ("create:" above a
// block mapping), not the line of the block's first entry.
func (n node) at() Pos {
	if n.key != nil {
		return Pos{n.file, n.key.Line}
	}
	return n.pos()
}

func (n node) errf(format string, args ...any) *Error { return errAt(n.pos(), format, args...) }

// nameErrf reports a problem of the whole element at the line naming it.
func (n node) nameErrf(format string, args ...any) *Error { return errAt(n.at(), format, args...) }

// pairs returns the keys and values of a mapping node, in order, refusing
// keys outside allowed (nil allows any).
func (n node) pairs(what string, allowed ...string) ([]string, []node, error) {
	if n.n.Kind != yaml.MappingNode {
		return nil, nil, n.errf("%s must be a mapping", what)
	}
	var keys []string
	var vals []node
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.n.Content); i += 2 {
		k := n.n.Content[i]
		if k.Kind != yaml.ScalarNode {
			return nil, nil, errAt(Pos{n.file, k.Line}, "%s: keys must be scalars", what)
		}
		if seen[k.Value] {
			return nil, nil, errAt(Pos{n.file, k.Line}, "%s: duplicate key %q", what, k.Value)
		}
		seen[k.Value] = true
		if allowed != nil && !slices.Contains(allowed, k.Value) {
			return nil, nil, errAt(Pos{n.file, k.Line}, "%s: unknown key %q", what, k.Value)
		}
		keys = append(keys, k.Value)
		vals = append(vals, node{n.file, n.n.Content[i+1], k})
	}
	return keys, vals, nil
}

func (n node) isNull() bool { return n.n.Kind == yaml.ScalarNode && n.n.Tag == "!!null" }

func (n node) str(what string) (string, error) {
	if n.n.Kind != yaml.ScalarNode || n.isNull() {
		return "", n.errf("%s must be a string", what)
	}
	return n.n.Value, nil
}

func (n node) integer(what string) (int, error) {
	if n.n.Kind != yaml.ScalarNode || n.n.Tag != "!!int" {
		return 0, n.errf("%s must be an integer", what)
	}
	v, err := strconv.Atoi(n.n.Value)
	if err != nil {
		return 0, n.errf("%s must be an integer", what)
	}
	return v, nil
}

func (n node) number(what string) (float64, error) {
	if n.n.Kind != yaml.ScalarNode || (n.n.Tag != "!!int" && n.n.Tag != "!!float") {
		return 0, n.errf("%s must be a number", what)
	}
	v, err := strconv.ParseFloat(n.n.Value, 64)
	if err != nil {
		return 0, n.errf("%s must be a number", what)
	}
	return v, nil
}

func (n node) boolean(what string) (bool, error) {
	if n.n.Kind != yaml.ScalarNode || n.n.Tag != "!!bool" {
		return false, n.errf("%s must be true or false", what)
	}
	return n.n.Value == "true", nil
}

func (n node) strings(what string) ([]string, error) {
	if n.n.Kind != yaml.SequenceNode {
		return nil, n.errf("%s must be a list", what)
	}
	var out []string
	for _, e := range n.n.Content {
		s, err := node{file: n.file, n: e}.str(what + " entry")
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// value decodes a scalar or structure into plain Go values (for defaults).
func (n node) value() (any, error) {
	var v any
	if err := n.n.Decode(&v); err != nil {
		return nil, n.errf("bad value: %v", err)
	}
	return v, nil
}

func (c *Catalog) loadShapes(path string) error {
	root, err := parseFile(path)
	if err != nil {
		return err
	}
	keys, vals, err := node{file: path, n: root}.pairs("shapes")
	if err != nil {
		return err
	}
	for i, name := range keys {
		v := vals[i]
		if !typeRe.MatchString(name) {
			return v.nameErrf("shape name %q must be UpperCamelCase", name)
		}
		s := &Shape{Name: name, Pos: v.at()}
		ks, vs, err := v.pairs("shape "+name, "pattern", "maxLength", "description", "words")
		if err != nil {
			return err
		}
		for j, k := range ks {
			switch k {
			case "pattern":
				if s.Pattern, err = vs[j].str("pattern"); err == nil {
					_, err = compilePattern(vs[j], s.Pattern)
				}
			case "maxLength":
				s.MaxLength, err = vs[j].integer("maxLength")
			case "description":
				s.Description, err = vs[j].str("description")
			case "words":
				s.Words, err = vs[j].str("words")
			}
			if err != nil {
				return err
			}
		}
		c.Shapes = append(c.Shapes, s)
		c.shapes[name] = s
	}
	return nil
}

func compilePattern(n node, p string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(p)
	if err != nil {
		return nil, n.errf("pattern %q does not compile: %v", p, err)
	}
	if !strings.HasPrefix(p, "^") || !strings.HasSuffix(p, "$") {
		return nil, n.errf("pattern %q must be anchored with ^ and $", p)
	}
	return re, nil
}

func (c *Catalog) loadErrors(path string) error {
	root, err := parseFile(path)
	if err != nil {
		return err
	}
	keys, vals, err := node{file: path, n: root}.pairs("errors")
	if err != nil {
		return err
	}
	for i, code := range keys {
		v := vals[i]
		if !codeRe.MatchString(code) {
			return v.nameErrf("error code %q must be UPPER_SNAKE_CASE", code)
		}
		e := &ErrorCode{Code: code, Pos: v.at()}
		ks, vs, err := v.pairs("error "+code, "status", "description")
		if err != nil {
			return err
		}
		for j, k := range ks {
			switch k {
			case "status":
				e.Status, err = vs[j].integer("status")
				if err == nil && (e.Status < 400 || e.Status > 599) {
					err = vs[j].errf("status %d of %s is not an HTTP error status", e.Status, code)
				}
			case "description":
				e.Description, err = vs[j].str("description")
			}
			if err != nil {
				return err
			}
		}
		if e.Status == 0 {
			return v.nameErrf("error %s has no status", code)
		}
		c.Errors = append(c.Errors, e)
	}
	return nil
}

func (c *Catalog) loadEvents(path, plugin string) error {
	root, err := parseFile(path)
	if err != nil {
		return err
	}
	keys, vals, err := node{file: path, n: root}.pairs("events")
	if err != nil {
		return err
	}
	for i, typ := range keys {
		v := vals[i]
		if !eventRe.MatchString(typ) {
			return v.nameErrf("event type %q must be dotted lowercase words", typ)
		}
		if plugin != "" && !strings.HasPrefix(typ, plugin+".") {
			return v.nameErrf("event type %q of plugin %s must start with %s.", typ, plugin, plugin)
		}
		if prev := c.Event(typ); prev != nil {
			return v.nameErrf("event type %s is already defined at %s", typ, prev.Pos)
		}
		e := &Event{Type: typ, Plugin: plugin, Pos: v.at()}
		ks, vs, err := v.pairs("event "+typ, "subject", "module", "description", "payload")
		if err != nil {
			return err
		}
		for j, k := range ks {
			switch k {
			case "subject":
				e.Subject, err = vs[j].str("subject")
			case "module":
				e.Module, err = vs[j].str("module")
			case "description":
				e.Description, err = vs[j].str("description")
			case "payload":
				e.Payload, err = c.objectSchema(vs[j], !hasKey(vs[j], "fields"))
			}
			if err != nil {
				return err
			}
		}
		if plugin != "" && e.Module != plugin {
			return v.errf("event %s of plugin %s must name module %s", typ, plugin, plugin)
		}
		c.Events = append(c.Events, e)
	}
	return nil
}

func (c *Catalog) declareGroup(path string, root *yaml.Node, plugin string) (*Group, error) {
	n := node{file: path, n: root}
	keys, vals, err := n.pairs("group file", "group", "plugin", "description", "types", "methods")
	if err != nil {
		return nil, err
	}
	g := &Group{File: path, Plugin: plugin}
	declared := ""
	for i, k := range keys {
		switch k {
		case "group":
			g.Name, err = vals[i].str("group")
			if base := filepath.Base(path); err == nil && g.Name+".yaml" != base && g.Name+MethodsSuffix != base {
				err = vals[i].errf("group %q must be defined in %s.yaml or %s%s", g.Name, g.Name, g.Name, MethodsSuffix)
			}
			if err == nil && !identRe.MatchString(g.Name) {
				err = vals[i].errf("group %q must be lowerCamelCase", g.Name)
			}
			// Two file names fit a group, so two files may define it.
			for _, other := range c.Groups {
				if err == nil && other.Name == g.Name && other.Plugin == plugin {
					err = vals[i].errf("group %s is already defined in %s", g.Name, other.File)
				}
			}
		case "plugin":
			if declared, err = vals[i].str("plugin"); err == nil && declared != plugin {
				if plugin == "" {
					err = vals[i].errf("plugin %q: a plugin's groups live in plugins/%s/catalog, not in the service's catalog", declared, declared)
				} else {
					err = vals[i].errf("plugin %q does not match the plugin directory %q", declared, plugin)
				}
			}
		case "description":
			g.Description, err = vals[i].str("description")
		}
		if err != nil {
			return nil, err
		}
	}
	if g.Name == "" {
		return nil, n.errf("group file has no group")
	}
	if plugin != "" && declared == "" {
		return nil, n.errf("group %s of plugin %s must say plugin: %s", g.Name, plugin, plugin)
	}
	return g, nil
}

// declareTypes declares the named types of g and returns their definitions,
// in order, for reading once every group has declared its own.
func (c *Catalog) declareTypes(g *Group, root *yaml.Node) ([]node, error) {
	keys, vals, err := node{file: g.File, n: root}.pairs("group file")
	if err != nil {
		return nil, err
	}
	idx := slices.Index(keys, "types")
	if idx < 0 {
		return nil, nil
	}
	names, defs, err := vals[idx].pairs("types")
	if err != nil {
		return nil, err
	}
	// Declare all names first so types may refer to each other.
	for i, name := range names {
		if !typeRe.MatchString(name) {
			return nil, defs[i].nameErrf("type name %q must be UpperCamelCase", name)
		}
		if prev, ok := c.types[name]; ok {
			return nil, defs[i].nameErrf("type %s is already defined at %s", name, prev.Pos)
		}
		t := &NamedType{Name: name, Group: g, Pos: defs[i].at()}
		c.types[name] = t
		g.Types = append(g.Types, t)
	}
	return defs, nil
}

// namedType resolves a ref: a type name, or Group.Type for a type that must
// be defined by that group. Type names are unique across groups.
func (c *Catalog) namedType(ref string) (*NamedType, bool) {
	grp, name, qualified := strings.Cut(ref, ".")
	if !qualified {
		t, ok := c.types[ref]
		return t, ok
	}
	t, ok := c.types[name]
	return t, ok && t.Group.Name == grp
}

func (c *Catalog) loadMethods(g *Group, root *yaml.Node) error {
	keys, vals, err := node{file: g.File, n: root}.pairs("group file")
	if err != nil {
		return err
	}
	idx := slices.Index(keys, "methods")
	if idx < 0 {
		return node{file: g.File, n: root}.errf("group %s has no methods", g.Name)
	}
	names, defs, err := vals[idx].pairs("methods")
	if err != nil {
		return err
	}
	for i, name := range names {
		m, err := c.method(g, name, defs[i])
		if err != nil {
			return err
		}
		g.Methods = append(g.Methods, m)
	}
	return nil
}

func (c *Catalog) method(g *Group, name string, n node) (*Method, error) {
	if !identRe.MatchString(name) {
		return nil, n.nameErrf("method name %q must be lowerCamelCase", name)
	}
	m := &Method{Group: g, Name: name, Pos: n.at(), keyPos: map[string]Pos{}}
	keys, vals, err := n.pairs("method "+name, "phase", "status", "kind", "action", "resource",
		"idempotency", "wait", "events", "errors", "description", "input", "exactlyOne", "output")
	if err != nil {
		return nil, err
	}
	var inputNode, resourceNode *node
	var exactly [][]string
	var exactlyNode node
	for i, k := range keys {
		v := vals[i]
		m.keyPos[k] = v.at()
		switch k {
		case "phase":
			if m.Phase, err = v.str("phase"); err == nil && !phaseRe.MatchString(m.Phase) {
				err = v.errf("phase %q must look like v0.1 or be none", m.Phase)
			}
		case "status":
			if m.Status, err = v.str("status"); err == nil && m.Status != StatusRegistered && m.Status != StatusPlanned {
				err = v.errf("status must be registered or planned, not %q", m.Status)
			}
		case "kind":
			if m.Kind, err = v.str("kind"); err == nil && !slices.Contains([]string{KindRead, KindMutation, KindPublic}, m.Kind) {
				err = v.errf("kind must be read, mutation or public, not %q", m.Kind)
			}
		case "action":
			if !v.isNull() {
				if m.Action, err = v.str("action"); err == nil && !actionRe.MatchString(m.Action) {
					err = v.errf("action %q must match %s", m.Action, actionRe)
				}
			}
		case "resource":
			resourceNode = &vals[i]
		case "idempotency":
			m.Idempotency, err = idempotency(v)
		case "wait":
			m.Wait, err = v.boolean("wait")
		case "events":
			m.Events, err = v.strings("events")
		case "errors":
			m.Errors, err = v.strings("errors")
		case "description":
			m.Description, err = v.str("description")
		case "input":
			inputNode = &vals[i]
		case "exactlyOne":
			exactly, err = exactlyOne(v)
			exactlyNode = v
		case "output":
			m.Output, err = c.outputSchema(v)
		}
		if err != nil {
			return nil, err
		}
	}
	for _, req := range []struct {
		ok   bool
		name string
	}{{m.Phase != "", "phase"}, {m.Status != "", "status"}, {m.Kind != "", "kind"},
		{inputNode != nil, "input"}, {m.Output != nil, "output"}, {m.Description != "", "description"}} {
		if !req.ok {
			return nil, n.nameErrf("method %s.%s has no %s", g.Name, name, req.name)
		}
	}
	if m.Input, err = c.objectSchema(*inputNode, true); err != nil {
		return nil, err
	}
	if m.Input.Fields == nil {
		m.Input.Fields = []*Field{}
	}
	m.Input.ExactlyOne = exactly
	if err := checkExactlyOne(exactlyNode, m.Input); err != nil {
		return nil, err
	}
	if resourceNode != nil {
		if m.Resource, err = resource(*resourceNode); err != nil {
			return nil, err
		}
	}
	switch {
	case m.Kind == KindPublic && (m.Action != "" || m.Resource != nil):
		return nil, n.nameErrf("public method %s.%s must have action null and no resource", g.Name, name)
	case m.Kind != KindPublic && (m.Action == "" || m.Resource == nil):
		return nil, n.nameErrf("method %s.%s of kind %s needs an action and a resource", g.Name, name, m.Kind)
	}
	if m.Wait && m.Kind != KindMutation {
		return nil, n.nameErrf("only mutations take wait")
	}
	return m, nil
}

func idempotency(n node) (*Idempotency, error) {
	keys, vals, err := n.pairs("idempotency", "key", "derivesId", "compare")
	if err != nil {
		return nil, err
	}
	id := &Idempotency{}
	for i, k := range keys {
		switch k {
		case "key":
			id.Key, err = vals[i].str("key")
		case "derivesId":
			id.DerivesID, err = vals[i].str("derivesId")
		case "compare":
			id.Compare, err = vals[i].strings("compare")
		}
		if err != nil {
			return nil, err
		}
	}
	if id.Key == "" {
		return nil, n.nameErrf("idempotency needs a key field")
	}
	return id, nil
}

func resourceRef(n node, what string) (*ResourceRef, error) {
	keys, vals, err := n.pairs(what, "type", "id")
	if err != nil {
		return nil, err
	}
	r := &ResourceRef{}
	for i, k := range keys {
		switch k {
		case "type":
			r.Type, err = vals[i].str("type")
		case "id":
			r.ID, err = vals[i].str("id")
		}
		if err != nil {
			return nil, err
		}
	}
	if !resTypRe.MatchString(r.Type) || r.ID == "" {
		return nil, n.nameErrf("%s needs a lowercase type and an id", what)
	}
	return r, nil
}

func resource(n node) (*Resource, error) {
	keys, vals, err := n.pairs("resource", "type", "id", "parent", "draft", "creates", "attributes", "items", "alternates", "rootTenantOnly")
	if err != nil {
		return nil, err
	}
	r := &Resource{}
	for i, k := range keys {
		v := vals[i]
		switch k {
		case "type":
			if r.Type, err = v.str("type"); err == nil && !resTypRe.MatchString(r.Type) {
				err = v.errf("resource type %q must be lowercase words with hyphens, without the prefix", r.Type)
			}
		case "id":
			r.ID, err = v.str("id")
		case "parent":
			r.Parent, err = resourceRef(v, "parent")
		case "draft":
			r.Draft, err = v.boolean("draft")
		case "creates":
			if r.Creates, err = v.str("creates"); err == nil && !resTypRe.MatchString(r.Creates) {
				err = v.errf("creates %q must be a resource type without the prefix", r.Creates)
			}
		case "attributes":
			r.Attributes, err = v.strings("attributes")
		case "items":
			r.Items, err = v.str("items")
		case "alternates":
			if v.n.Kind != yaml.SequenceNode {
				return nil, v.errf("alternates must be a list")
			}
			for _, e := range v.n.Content {
				a, err := alternate(node{file: v.file, n: e})
				if err != nil {
					return nil, err
				}
				r.Alternates = append(r.Alternates, a)
			}
		case "rootTenantOnly":
			r.RootTenantOnly, err = condition(v, "rootTenantOnly")
		}
		if err != nil {
			return nil, err
		}
	}
	if r.Type == "" || r.ID == "" {
		return nil, n.nameErrf("resource needs a type and an id")
	}
	return r, nil
}

func alternate(n node) (*Alternate, error) {
	keys, vals, err := n.pairs("alternate", "type", "id", "when")
	if err != nil {
		return nil, err
	}
	a := &Alternate{}
	for i, k := range keys {
		switch k {
		case "type":
			a.Type, err = vals[i].str("type")
		case "id":
			a.ID, err = vals[i].str("id")
		case "when":
			var c *Condition
			if c, err = condition(vals[i], "when"); err == nil {
				a.WhenField, a.WhenIn = c.Field, c.In
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if a.Type == "" || a.ID == "" || a.WhenField == "" {
		return nil, n.errf("an alternate needs type, id and when.field")
	}
	return a, nil
}

// condition reads {field, in}: the field is required, in is optional.
func condition(n node, what string) (*Condition, error) {
	keys, vals, err := n.pairs(what, "field", "in")
	if err != nil {
		return nil, err
	}
	c := &Condition{}
	for i, k := range keys {
		switch k {
		case "field":
			c.Field, err = vals[i].str("field")
		case "in":
			c.In, err = vals[i].strings("in")
		}
		if err != nil {
			return nil, err
		}
	}
	if c.Field == "" && what != "when" {
		return nil, n.errf("%s needs a field", what)
	}
	return c, nil
}

func exactlyOne(n node) ([][]string, error) {
	if n.n.Kind != yaml.SequenceNode {
		return nil, n.nameErrf("exactlyOne must be a list of field lists")
	}
	var out [][]string
	for _, e := range n.n.Content {
		names, err := node{file: n.file, n: e}.strings("exactlyOne")
		if err != nil {
			return nil, err
		}
		if len(names) < 2 {
			return nil, node{file: n.file, n: e}.errf("exactlyOne needs at least two fields")
		}
		out = append(out, names)
	}
	return out, nil
}

func checkExactlyOne(n node, obj *Schema) error {
	for _, set := range obj.ExactlyOne {
		for _, f := range set {
			fd := obj.Field(f)
			if fd == nil {
				return n.nameErrf("exactlyOne names %q, which is not a field", f)
			}
			if fd.Schema.Required {
				return n.nameErrf("exactlyOne field %q must not be required", f)
			}
		}
	}
	return nil
}

func (c *Catalog) outputSchema(n node) (*Schema, error) {
	if n.n.Kind == yaml.ScalarNode {
		name, err := n.str("output")
		if err != nil {
			return nil, err
		}
		t, ok := c.namedType(name)
		if !ok {
			return nil, n.errf("output names unknown type %q", name)
		}
		return &Schema{Type: TObject, Ref: t, Required: true, Pos: n.pos()}, nil
	}
	return c.objectSchema(n, false)
}

// objectSchema reads {fields: ..., exactlyOne: ..., description: ...} or,
// when bare (method inputs), a mapping of fields.
func (c *Catalog) objectSchema(n node, bare bool) (*Schema, error) {
	keys, vals, err := n.pairs("object")
	if err != nil {
		return nil, err
	}
	s := &Schema{Type: TObject, Required: true, Pos: n.at()}
	if bare {
		s.Fields = []*Field{}
		return s, c.fields(s, keys, vals)
	}
	var exNode node
	for i, k := range keys {
		switch k {
		case "fields":
			fk, fv, err := vals[i].pairs("fields")
			if err != nil {
				return nil, err
			}
			s.Fields = []*Field{}
			if err := c.fields(s, fk, fv); err != nil {
				return nil, err
			}
		case "description":
			s.Description, err = vals[i].str("description")
		case "exactlyOne":
			s.ExactlyOne, err = exactlyOne(vals[i])
			exNode = vals[i]
		default:
			return nil, vals[i].nameErrf("object: unknown key %q", k)
		}
		if err != nil {
			return nil, err
		}
	}
	return s, checkExactlyOne(exNode, s)
}

func (c *Catalog) fields(s *Schema, keys []string, vals []node) error {
	for i, name := range keys {
		if !identRe.MatchString(name) {
			return vals[i].nameErrf("field name %q must be lowerCamelCase", name)
		}
		fs, err := c.schema(vals[i], name)
		if err != nil {
			return err
		}
		s.Fields = append(s.Fields, &Field{Name: name, Schema: fs})
	}
	return nil
}

var schemaKeys = []string{"shape", "type", "ref", "required", "nullable", "default", "description",
	"minLength", "maxLength", "pattern", "enum", "format", "minimum", "maximum",
	"fields", "exactlyOne", "values", "keyPattern", "maxEntries", "items", "minItems", "maxItems"}

func (c *Catalog) schema(n node, name string) (*Schema, error) {
	keys, vals, err := n.pairs("field "+name, schemaKeys...)
	if err != nil {
		return nil, err
	}
	s := &Schema{Pos: n.at()}
	get := func(k string) (node, bool) {
		if i := slices.Index(keys, k); i >= 0 {
			return vals[i], true
		}
		return node{}, false
	}
	// The type comes from exactly one of shape, ref and type.
	shapeN, hasShape := get("shape")
	refN, hasRef := get("ref")
	typeN, hasType := get("type")
	switch {
	case btoi(hasShape)+btoi(hasRef)+btoi(hasType) != 1:
		return nil, n.nameErrf("field %s needs exactly one of shape, ref and type", name)
	case hasShape:
		sn, err := shapeN.str("shape")
		if err != nil {
			return nil, err
		}
		sh, ok := c.shapes[sn]
		if !ok {
			return nil, shapeN.errf("unknown shape %q", sn)
		}
		s.Type, s.Shape, s.Pattern = TString, sh.Name, sh.Pattern
		if sh.MaxLength > 0 {
			s.MaxLength = ptr(sh.MaxLength)
		}
		s.Description = sh.Description
	case hasRef:
		rn, err := refN.str("ref")
		if err != nil {
			return nil, err
		}
		t, ok := c.namedType(rn)
		if !ok {
			return nil, refN.errf("unknown type %q", rn)
		}
		s.Type, s.Ref = TObject, t
	default:
		if s.Type, err = typeN.str("type"); err != nil {
			return nil, err
		}
		if !slices.Contains([]string{TString, TInteger, TNumber, TBoolean, TObject, TMap, TArray, TAny}, s.Type) {
			return nil, typeN.errf("unknown type %q", s.Type)
		}
	}
	allowed := map[string][]string{
		TString:  {"minLength", "maxLength", "pattern", "enum", "format"},
		TInteger: {"minimum", "maximum"},
		TNumber:  {"minimum", "maximum"},
		TObject:  {"fields", "exactlyOne"},
		TMap:     {"values", "keyPattern", "maxEntries"},
		TArray:   {"items", "minItems", "maxItems"},
	}
	common := []string{"shape", "type", "ref", "required", "nullable", "default", "description"}
	for i, k := range keys {
		if !slices.Contains(common, k) && !slices.Contains(allowed[s.Type], k) {
			return nil, vals[i].nameErrf("field %s: %q does not apply to type %s", name, k, s.Type)
		}
		if s.Ref != nil && k != "ref" && !slices.Contains([]string{"required", "nullable", "description"}, k) {
			return nil, vals[i].nameErrf("field %s: %q does not apply to a ref", name, k)
		}
	}
	var exNode node
	for i, k := range keys {
		v := vals[i]
		switch k {
		case "required":
			s.Required, err = v.boolean("required")
		case "nullable":
			s.Nullable, err = v.boolean("nullable")
		case "description":
			s.Description, err = v.str("description")
		case "default":
			s.HasDefault = true
			s.Default, err = v.value()
		case "minLength":
			var x int
			x, err = v.integer("minLength")
			s.MinLength = &x
		case "maxLength":
			var x int
			x, err = v.integer("maxLength")
			s.MaxLength = &x
		case "pattern":
			if s.Pattern, err = v.str("pattern"); err == nil {
				_, err = compilePattern(v, s.Pattern)
			}
		case "keyPattern":
			if s.KeyPattern, err = v.str("keyPattern"); err == nil {
				_, err = compilePattern(v, s.KeyPattern)
			}
		case "enum":
			s.Enum, err = v.strings("enum")
		case "format":
			if s.Format, err = v.str("format"); err == nil && !slices.Contains(Formats, s.Format) {
				err = v.errf("unknown format %q (one of %s)", s.Format, strings.Join(Formats, ", "))
			}
		case "minimum":
			var x float64
			x, err = v.number("minimum")
			s.Minimum = &x
		case "maximum":
			var x float64
			x, err = v.number("maximum")
			s.Maximum = &x
		case "fields":
			var fk []string
			var fv []node
			if fk, fv, err = v.pairs("fields"); err == nil {
				s.Fields = []*Field{}
				err = c.fields(s, fk, fv)
			}
		case "exactlyOne":
			s.ExactlyOne, err = exactlyOne(v)
			exNode = v
		case "values":
			s.Values, err = c.schema(v, name+" values")
		case "items":
			s.Items, err = c.schema(v, name+" items")
		case "maxEntries":
			var x int
			x, err = v.integer("maxEntries")
			s.MaxEntries = &x
		case "minItems":
			var x int
			x, err = v.integer("minItems")
			s.MinItems = &x
		case "maxItems":
			var x int
			x, err = v.integer("maxItems")
			s.MaxItems = &x
		}
		if err != nil {
			return nil, err
		}
	}
	if err := checkExactlyOne(exNode, s); err != nil {
		return nil, err
	}
	return s, checkSchema(n, name, s)
}

func checkSchema(n node, name string, s *Schema) error {
	switch {
	case s.Type == TMap && s.Values == nil:
		return n.nameErrf("map %s needs values", name)
	case s.Type == TArray && s.Items == nil:
		return n.nameErrf("array %s needs items", name)
	case s.MinLength != nil && s.MaxLength != nil && *s.MinLength > *s.MaxLength:
		return n.nameErrf("field %s: minLength above maxLength", name)
	case s.Minimum != nil && s.Maximum != nil && *s.Minimum > *s.Maximum:
		return n.nameErrf("field %s: minimum above maximum", name)
	case s.Type == TInteger && ((s.Minimum != nil && *s.Minimum != float64(int64(*s.Minimum))) ||
		(s.Maximum != nil && *s.Maximum != float64(int64(*s.Maximum)))):
		return n.nameErrf("field %s: integer bounds must be integers", name)
	case s.Required && s.HasDefault:
		return n.nameErrf("field %s: a required field takes no default", name)
	case s.Format == FormatByte && (s.HasDefault || s.Pattern != "" || len(s.Enum) > 0):
		// Bytes are decoded from base64: a default, pattern or enum would
		// constrain the text, not the bytes.
		return n.nameErrf("field %s: format byte takes no default, pattern or enum", name)
	case s.Nullable && s.HasDefault:
		// A nullable input tells absent, null and a value apart; a default
		// would make absent a value, which wire.Nullable cannot express.
		return n.nameErrf("field %s: a nullable field takes no default", name)
	}
	if s.HasDefault {
		if err := checkDefault(s); err != nil {
			return n.nameErrf("field %s: default %v", name, err)
		}
	}
	return nil
}

func checkDefault(s *Schema) error {
	switch s.Type {
	case TString:
		v, ok := s.Default.(string)
		if !ok {
			return fmt.Errorf("must be a string")
		}
		if len(s.Enum) > 0 && !slices.Contains(s.Enum, v) {
			return fmt.Errorf("%q is not one of the enum values", v)
		}
		if s.Pattern != "" && !regexp.MustCompile(s.Pattern).MatchString(v) {
			return fmt.Errorf("%q does not match the pattern", v)
		}
	case TInteger:
		v, ok := s.Default.(int)
		if !ok {
			return fmt.Errorf("must be an integer")
		}
		if (s.Minimum != nil && float64(v) < *s.Minimum) || (s.Maximum != nil && float64(v) > *s.Maximum) {
			return fmt.Errorf("%d is out of bounds", v)
		}
	case TNumber:
		switch s.Default.(type) {
		case int, float64:
		default:
			return fmt.Errorf("must be a number")
		}
	case TBoolean:
		if _, ok := s.Default.(bool); !ok {
			return fmt.Errorf("must be true or false")
		}
	case TObject, TMap:
		m, ok := s.Default.(map[string]any)
		if !ok || len(m) != 0 {
			return fmt.Errorf("of an object may only be {}")
		}
	case TArray:
		a, ok := s.Default.([]any)
		if !ok || len(a) != 0 {
			return fmt.Errorf("of an array may only be []")
		}
	default:
		if m, ok := s.Default.(map[string]any); !ok || len(m) != 0 {
			return fmt.Errorf("of any may only be {}")
		}
	}
	return nil
}

// checkMethods checks what spans files: error codes, events, resource and
// idempotency fields that must name input fields.
func (c *Catalog) checkMethods() error {
	codes := map[string]bool{}
	for _, e := range c.Errors {
		codes[e.Code] = true
	}
	events := map[string]bool{}
	for _, e := range c.Events {
		events[e.Type] = true
	}
	slices.SortFunc(c.Groups, func(a, b *Group) int { return cmp.Compare(a.Name, b.Name) })
	for _, m := range c.Methods() {
		at := func(key, format string, args ...any) error {
			return errAt(m.posOf(key), "%s: "+format, append([]any{m.FullName()}, args...)...)
		}
		for _, e := range m.Errors {
			if !codes[e] {
				return at("errors", "unknown error code %s", e)
			}
		}
		for _, e := range m.Events {
			if len(c.Events) > 0 && !events[e] {
				return at("events", "event %s is not in %s", e, EventsFile)
			}
		}
		if err := checkPluginMethod(m, at); err != nil {
			return err
		}
		if m.Resource != nil {
			r := m.Resource
			ids := []string{r.ID}
			if r.Parent != nil {
				ids = append(ids, r.Parent.ID)
			}
			for _, a := range r.Alternates {
				ids = append(ids, a.ID)
				if m.Input.Field(a.WhenField) == nil {
					return at("resource", "alternate condition names %q, which is not an input field", a.WhenField)
				}
			}
			if c := r.RootTenantOnly; c != nil {
				f := m.Input.Field(c.Field)
				switch {
				case f == nil:
					return at("resource", "rootTenantOnly names %q, which is not an input field", c.Field)
				case m.Input.Field("tenantId") == nil:
					return at("resource", "rootTenantOnly needs a tenantId input field")
				case f.Schema.Default != nil && slices.Contains(c.In, fmt.Sprint(f.Schema.Default)):
					// The check reads the body as sent, before defaults.
					return at("resource", "rootTenantOnly.in holds the default of %q, which an absent field would not show", c.Field)
				}
			}
			for _, id := range ids {
				if id != "global" && m.Input.Field(id) == nil && !(r.Draft && m.Idempotency != nil && m.Idempotency.DerivesID == id) {
					return at("resource", "resource id %q is not an input field", id)
				}
			}
			for _, a := range r.Attributes {
				if m.Input.Field(a) == nil {
					return at("resource", "attribute %q is not an input field", a)
				}
			}
		}
		if id := m.Idempotency; id != nil && id.DerivesID != "" {
			f := m.Output.Field(id.DerivesID)
			if f == nil || f.Schema.Shape == "" {
				return at("derivesId %q must be an output field with an id shape", id.DerivesID)
			}
			sh := c.shapes[f.Schema.Shape]
			mm := idPrefixRe.FindStringSubmatch(sh.Pattern)
			if mm == nil {
				return at("the shape %s of %s has no id prefix", sh.Name, id.DerivesID)
			}
			id.IDPrefix = mm[1]
		}
		if id := m.Idempotency; id != nil {
			if m.Input.Field(id.Key) == nil {
				return at("idempotency", "idempotency key %q is not an input field", id.Key)
			}
			for _, f := range id.Compare {
				if m.Input.Field(f) == nil {
					return at("idempotency", "idempotency compares %q, which is not an input field", f)
				}
			}
		}
	}
	return nil
}

// checkPluginMethod holds a plugin's method to what the plugin host serves
// (docs/plugins.md): actions under compute:<plugin>:, one decision on a
// real resource, events of the plugin's own family, and none of the
// service-side machinery a plugin process cannot take part in.
func checkPluginMethod(m *Method, at func(key, format string, args ...any) error) error {
	p := m.Group.Plugin
	if p == "" {
		return nil
	}
	switch {
	case m.Kind == KindPublic:
		return at("kind", "a plugin's method is read or mutation: every call is decided")
	case !strings.HasPrefix(m.Action, "compute:"+p+":"):
		return at("action", "action %q of plugin %s must begin compute:%s:", m.Action, p, p)
	case m.Resource == nil:
		return at("resource", "a plugin's method names the resource its decision is made on")
	case m.Resource.Draft:
		return at("resource", "a plugin's method cannot admit through a draft")
	case m.Idempotency != nil:
		return at("idempotency", "idempotency keys are not offered to plugins yet")
	case m.Wait:
		return at("wait", "wait is not offered to plugins")
	}
	for _, e := range m.Events {
		if !strings.HasPrefix(e, p+".") {
			return at("events", "event %s is not of plugin %s's family %s.*", e, p, p)
		}
	}
	return nil
}

func hasKey(n node, key string) bool {
	if n.n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i < len(n.n.Content); i += 2 {
		if n.n.Content[i].Value == key {
			return true
		}
	}
	return false
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func ptr[T any](v T) *T { return &v }

func sortBy[T any](s []T, key func(T) string) {
	slices.SortStableFunc(s, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
}
