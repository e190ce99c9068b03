package plugins

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"computeplane/gen/api"
	"computeplane/internal/wire"
)

// payloadSchemas are the compiled payload schemas of the plugins' event
// types (api.EventSpec.PayloadSchema, generated from each plugin's
// catalog), compiled once.
var payloadSchemas = sync.OnceValues(func() (map[string]*jsonschema.Schema, error) {
	out := map[string]*jsonschema.Schema{}
	c := jsonschema.NewCompiler()
	// Patterns as compact matchers where they can be (wire.MustPattern says why).
	c.UseRegexpEngine(func(src string) (jsonschema.Regexp, error) { return wire.CompilePattern(src) })
	c.DefaultDraft(jsonschema.Draft2020)
	for _, e := range api.EventTypes {
		if e.Plugin == "" || e.PayloadSchema == "" {
			continue
		}
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(e.PayloadSchema))
		if err != nil {
			return nil, fmt.Errorf("plugins: the payload schema of %s: %w", e.Type, err)
		}
		url := "urn:computeplane:event:" + e.Type
		if err := c.AddResource(url, doc); err != nil {
			return nil, err
		}
		s, err := c.Compile(url)
		if err != nil {
			return nil, fmt.Errorf("plugins: the payload schema of %s: %w", e.Type, err)
		}
		out[e.Type] = s
	}
	return out, nil
})

// checkPayload refuses an event payload that does not fit the payload its
// plugin's catalog declares for the type (fields, types, bounds; no
// undeclared field).
func checkPayload(plugin, eventType string, data []byte) error {
	schemas, err := payloadSchemas()
	if err != nil {
		return err
	}
	s := schemas[eventType]
	if s == nil {
		return fmt.Errorf("plugin %s published %q, which no plugin catalog declares", plugin, eventType)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("plugin %s published %s with a payload that is not JSON: %w", plugin, eventType, err)
	}
	if err := s.Validate(inst); err != nil {
		return fmt.Errorf("plugin %s published %s with a payload its catalog does not declare: %s", plugin, eventType, oneLine(err.Error()))
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
