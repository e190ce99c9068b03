package profiles

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"computeplane/catalog"
	"computeplane/internal/wire"
)

// Phases of a step, in the order a profile runs them.
var Phases = []string{"prepare", "provision", "configure", "verify"}

// Defaults of a step that names none.
const (
	DefaultTimeoutSeconds = 300
	DefaultRetries        = 0
)

// Limits of composition: how deep profiles include profiles, and how many
// steps a rendering may expand to.
const (
	MaxDepth         = 8
	MaxExpandedSteps = 1000
)

// ProfileUsePrefix marks a step's uses that names another profile:
// profile:<id>@<version>.
const ProfileUsePrefix = "profile:"

// Issue is one problem of a profile document, by the path of the field
// it is about (steps[2].with.slot), relative to the document.
type Issue struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// Document is a profile document as the schema (catalog/profile.schema.json)
// defines it.
type Document struct {
	ID          string      `json:"id"`
	Version     int         `json:"version"`
	Description string      `json:"description,omitempty"`
	Requires    []string    `json:"requires,omitempty"`
	Image       string      `json:"image,omitempty"`
	UserData    string      `json:"userData,omitempty"`
	HostConfig  *HostConfig `json:"hostConfig,omitempty"`
	Steps       []DocStep   `json:"steps"`
}

// HostConfig is the configuration of the installed host.
type HostConfig struct {
	Hostname          string            `json:"hostname,omitempty"`
	KernelArgs        []string          `json:"kernelArgs,omitempty"`
	Sysctl            map[string]string `json:"sysctl,omitempty"`
	SSHAuthorizedKeys []string          `json:"sshAuthorizedKeys,omitempty"`
}

// DocStep is one step as the document writes it.
type DocStep struct {
	Name           string         `json:"name"`
	Phase          string         `json:"phase"`
	Uses           string         `json:"uses"`
	With           map[string]any `json:"with,omitempty"`
	TimeoutSeconds *int           `json:"timeoutSeconds,omitempty"`
	Retries        *int           `json:"retries,omitempty"`
}

// UsesProfile splits a uses naming a profile (profile:<id>@<version>).
func UsesProfile(uses string) (id string, version int, ok bool) {
	rest, ok := strings.CutPrefix(uses, ProfileUsePrefix)
	if !ok {
		return "", 0, false
	}
	at := strings.LastIndexByte(rest, '@')
	if at <= 0 {
		return "", 0, false
	}
	v, err := strconv.Atoi(rest[at+1:])
	if err != nil || v < 1 || v > 1000000 {
		return "", 0, false
	}
	return rest[:at], v, true
}

var schema = func() *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(catalog.ProfileSchema))
	if err != nil {
		panic("profiles: catalog/profile.schema.json is not JSON: " + err.Error())
	}
	c := jsonschema.NewCompiler()
	// Patterns as compact matchers where they can be (wire.MustPattern says why).
	c.UseRegexpEngine(func(src string) (jsonschema.Regexp, error) { return wire.CompilePattern(src) })
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	const url = "urn:computeplane:profile"
	if err := c.AddResource(url, doc); err != nil {
		panic("profiles: " + err.Error())
	}
	s, err := c.Compile(url)
	if err != nil {
		panic("profiles: catalog/profile.schema.json: " + err.Error())
	}
	return s
}()

var printer = message.NewPrinter(language.English)

// Check checks a document's definition: its structure by the JSON Schema,
// then what a schema cannot say (step names unique, phases that never go
// back). It returns every issue in document order (the first is the first
// offending field) and, when there is none, the parsed document. Whether
// each uses resolves and its with is accepted is Resolve's part.
func Check(v any) (*Document, []Issue) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, []Issue{{Path: "", Message: "is not JSON"}}
	}
	return CheckJSON(raw)
}

// CheckJSON is Check of a document in JSON.
func CheckJSON(raw []byte) (*Document, []Issue) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, []Issue{{Path: "", Message: "is not JSON"}}
	}
	var out []Issue
	if err := schema.Validate(inst); err != nil {
		ve, ok := err.(*jsonschema.ValidationError)
		if !ok {
			return nil, []Issue{{Path: "", Message: err.Error()}}
		}
		out = leaves(ve)
		sortIssues(out)
		return nil, out
	}
	// The schema takes 1.0 for the integer 1, encoding/json does not:
	// numbers are written again the way Go writes them first.
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, []Issue{{Path: "", Message: "is not JSON"}}
	}
	if raw, err = json.Marshal(v); err != nil {
		return nil, []Issue{{Path: "", Message: "is not JSON"}}
	}
	var d Document
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, []Issue{{Path: "", Message: "is not a profile document: " + err.Error()}}
	}
	names := map[string]int{}
	phase := 0
	for i, s := range d.Steps {
		if j, ok := names[s.Name]; ok {
			out = append(out, Issue{Path: fmt.Sprintf("steps[%d].name", i), Message: fmt.Sprintf("%s is the name of steps[%d] too", s.Name, j)})
		} else {
			names[s.Name] = i
		}
		p := slices.Index(Phases, s.Phase)
		if p < phase {
			out = append(out, Issue{Path: fmt.Sprintf("steps[%d].phase", i),
				Message: fmt.Sprintf("%s comes after %s: phases run in the order %s", s.Phase, Phases[phase], strings.Join(Phases, ", "))})
		}
		phase = max(phase, p)
	}
	if len(out) > 0 {
		sortIssues(out)
		return nil, out
	}
	return &d, nil
}

// leaves turns the schema's error tree into issues, one per leaf, each
// naming the field it is about (a missing or unknown property by its own
// path).
func leaves(ve *jsonschema.ValidationError) []Issue {
	var out []Issue
	seen := map[Issue]bool{}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		loc := e.InstanceLocation
		var is []Issue
		switch k := e.ErrorKind.(type) {
		case *kind.Required:
			for _, m := range k.Missing {
				is = append(is, Issue{Path: issuePath(append(slices.Clone(loc), m)), Message: "is required"})
			}
		case *kind.AdditionalProperties:
			for _, p := range k.Properties {
				is = append(is, Issue{Path: issuePath(append(slices.Clone(loc), p)), Message: "is not a field of a profile document here"})
			}
		case *kind.FalseSchema:
			is = append(is, Issue{Path: issuePath(loc), Message: "is not accepted on a step that uses a profile (its steps have their own)"})
		default:
			is = append(is, Issue{Path: issuePath(loc), Message: e.ErrorKind.LocalizedString(printer)})
		}
		for _, i := range is {
			if !seen[i] {
				seen[i] = true
				out = append(out, i)
			}
		}
	}
	walk(ve)
	return out
}

// issuePath writes an instance location as steps[2].with.slot.
func issuePath(loc []string) string {
	var b strings.Builder
	for i, seg := range loc {
		if _, err := strconv.Atoi(seg); err == nil && i > 0 && (loc[i-1] == "steps" || loc[i-1] == "requires" ||
			loc[i-1] == "kernelArgs" || loc[i-1] == "sshAuthorizedKeys") {
			b.WriteString("[" + seg + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
	}
	return b.String()
}

// fieldOrder is the order fields are written in a document; issues are
// sorted by it so that the first issue is the first offending field.
var fieldOrder = map[string]int{
	"id": 1, "version": 2, "description": 3, "requires": 4, "image": 5, "userData": 6, "hostConfig": 7, "steps": 8,
	"hostname": 1, "kernelArgs": 2, "sysctl": 3, "sshAuthorizedKeys": 4,
	"name": 1, "phase": 2, "uses": 3, "with": 4, "timeoutSeconds": 5, "retries": 6,
}

// pathKey splits a path into comparable segments: known fields by their
// order, indexes by number, other keys by name after the known ones.
func pathKey(p string) []string {
	var out []string
	free := false // under with or sysctl, keys are the writer's: by name
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return r == '.' || r == '[' }) {
		if n, err := strconv.Atoi(strings.TrimSuffix(seg, "]")); err == nil && strings.HasSuffix(seg, "]") {
			out = append(out, fmt.Sprintf("0%010d", n))
		} else if o, ok := fieldOrder[seg]; ok && !free {
			free = seg == "with" || seg == "sysctl"
			out = append(out, fmt.Sprintf("1%03d", o))
		} else {
			out = append(out, "2"+seg)
		}
	}
	return out
}

func sortIssues(is []Issue) {
	sort.SliceStable(is, func(i, j int) bool {
		if c := slices.Compare(pathKey(is[i].Path), pathKey(is[j].Path)); c != 0 {
			return c < 0
		}
		return is[i].Message < is[j].Message
	})
}
