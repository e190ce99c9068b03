package gogen

import (
	"encoding/json"

	"computeplane/tools/catalogc/catalog"
)

// jsonSchema renders a catalog schema as JSON Schema (draft 2020-12),
// named types inlined: the payload check of a plugin's events
// (internal/plugins) compiles it. Objects with fields refuse other
// properties, as the catalog's decoding does.
func jsonSchema(s *catalog.Schema) string {
	b, _ := json.Marshal(schemaMap(s, 0))
	return string(b)
}

func schemaMap(s *catalog.Schema, depth int) map[string]any {
	if s.Ref != nil {
		if depth > 16 {
			return map[string]any{} // a recursive type: deeper levels unchecked
		}
		m := schemaMap(s.Ref.Schema, depth+1)
		if s.Nullable {
			return map[string]any{"anyOf": []any{m, map[string]any{"type": "null"}}}
		}
		return m
	}
	m := map[string]any{}
	typ := func(t string) {
		if s.Nullable {
			m["type"] = []string{t, "null"}
		} else {
			m["type"] = t
		}
	}
	switch s.Type {
	case catalog.TString:
		typ("string")
		if s.MinLength != nil {
			m["minLength"] = *s.MinLength
		}
		if s.MaxLength != nil {
			m["maxLength"] = *s.MaxLength
		}
		if s.Pattern != "" {
			m["pattern"] = s.Pattern
		}
		if len(s.Enum) > 0 {
			enum := []any{}
			for _, e := range s.Enum {
				enum = append(enum, e)
			}
			if s.Nullable {
				enum = append(enum, nil)
			}
			m["enum"] = enum
		}
	case catalog.TInteger, catalog.TNumber:
		typ(s.Type)
		if s.Minimum != nil {
			m["minimum"] = *s.Minimum
		}
		if s.Maximum != nil {
			m["maximum"] = *s.Maximum
		}
	case catalog.TBoolean:
		typ("boolean")
	case catalog.TArray:
		typ("array")
		if s.Items != nil {
			m["items"] = schemaMap(s.Items, depth+1)
		}
		if s.MinItems != nil {
			m["minItems"] = *s.MinItems
		}
		if s.MaxItems != nil {
			m["maxItems"] = *s.MaxItems
		}
	case catalog.TMap:
		typ("object")
		if s.Values != nil {
			m["additionalProperties"] = schemaMap(s.Values, depth+1)
		}
		if s.KeyPattern != "" {
			m["propertyNames"] = map[string]any{"pattern": s.KeyPattern}
		}
		if s.MaxEntries != nil {
			m["maxProperties"] = *s.MaxEntries
		}
	case catalog.TObject:
		typ("object")
		if s.Fields != nil {
			props := map[string]any{}
			required := []string{}
			for _, f := range s.Fields {
				props[f.Name] = schemaMap(f.Schema, depth+1)
				if f.Schema.Required {
					required = append(required, f.Name)
				}
			}
			m["properties"] = props
			m["required"] = required
			m["additionalProperties"] = false
		}
	}
	return m
}
