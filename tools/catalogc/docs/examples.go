package docs

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"computeplane/tools/catalogc/catalog"
	"computeplane/tools/catalogc/cligen"
)

// shapeExamples are example values of the shapes that are not ids.
var shapeExamples = map[string]string{
	"TenantId": "acme", "Name63": "example", "Region": "eu-west", "RuntimeName": "qemu", "ImageId": "debian-12",
	"IdemKeyA": "key-1", "IdemKeyB": "key-1", "SecretName": "db-password", "MeterName": "node.hours",
	"ProfileId": "base", "IdentityId": "ann",
}

var idPrefix = regexp.MustCompile(`^\^([a-z]+)_`)

// example is a value of s that passes its rules, for the page's examples.
func example(c *catalog.Catalog, s *catalog.Schema) any {
	if s.Ref != nil {
		return exampleObject(c, s.Ref.Schema)
	}
	switch s.Type {
	case catalog.TString:
		if len(s.Enum) > 0 {
			return s.Enum[0]
		}
		if v, ok := shapeExamples[s.Shape]; ok {
			return v
		}
		if m := idPrefix.FindStringSubmatch(s.Pattern); m != nil {
			return m[1] + "_0123456789abcdefghjkmnpqrs"
		}
		return "example"
	case catalog.TInteger, catalog.TNumber:
		if s.Minimum != nil && *s.Minimum > 1 {
			return int64(*s.Minimum)
		}
		if s.Maximum != nil && *s.Maximum < 1 {
			return int64(*s.Maximum)
		}
		return 1
	case catalog.TBoolean:
		return true
	case catalog.TArray:
		if s.MinItems != nil && *s.MinItems > 0 && s.Items != nil {
			return []any{example(c, s.Items)}
		}
		return []any{}
	case catalog.TObject:
		return exampleObject(c, s)
	}
	return map[string]any{}
}

func exampleObject(c *catalog.Catalog, s *catalog.Schema) map[string]any {
	out := map[string]any{}
	for _, f := range s.Fields {
		if f.Schema.Required {
			out[f.Name] = example(c, f.Schema)
		}
	}
	return out
}

// examples are a curl and a computectl call of m with its required input.
func examples(c *catalog.Catalog, m *catalog.Method) (curl, cli string) {
	body := map[string]any{}
	var flags []string
	if m.Input != nil {
		for _, f := range m.Input.Fields {
			if !f.Schema.Required {
				continue
			}
			v := example(c, f.Schema)
			body[f.Name] = v
			if f.Name == "tenantId" {
				continue // computectl takes it from SERVICE_TENANT or the key
			}
			flags = append(flags, "--"+cligen.Kebab(f.Name)+" "+shellWord(v))
		}
	}
	raw, _ := json.Marshal(body) // maps of example values always encode
	auth := ` -H "Authorization: Bearer $SERVICE_TOKEN"`
	if m.Kind == "public" {
		auth = ""
	}
	curl = fmt.Sprintf(`curl -s -X POST "$SERVICE_URL/api/compute%s" -H 'X-Service: 1' -H 'Content-Type: application/json'%s -d '%s'`,
		m.Route(), auth, raw)
	sort.Strings(flags) // stable, whatever the map did
	cli = strings.TrimSpace("computectl " + m.Group.Name + " " + m.Name + " " + strings.Join(flags, " "))
	return curl, cli
}

// shellWord writes a flag value as the shell would need it.
func shellWord(v any) string {
	s, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v)
		s = string(b)
	}
	if regexp.MustCompile(`^[A-Za-z0-9._:/@+=-]+$`).MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
