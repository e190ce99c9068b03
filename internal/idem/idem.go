// Package idem is the shared idempotency machinery of creates: the request
// fingerprint a create stores beside what it made, and the comparison that
// answers a retry with the same result or CONFLICT when the same key came
// with a different request. wait never takes part.
package idem

import (
	"encoding/json"
	"reflect"

	"computeplane/gen/api"
)

// Fingerprint is the canonical JSON of the fields the method compares under
// one key (its registry row's Compare list), taken from the parsed input;
// absent fields are absent.
func Fingerprint(m *api.Method, fields map[string]any) []byte {
	fp := map[string]any{}
	if m.Idempotency != nil {
		for _, f := range m.Idempotency.Compare {
			if v, ok := fields[f]; ok && f != "wait" {
				fp[f] = v
			}
		}
	}
	b, err := json.Marshal(fp) // map keys are sorted: canonical
	if err != nil {
		panic(err) // values came from parsed JSON
	}
	return b
}

// Check compares a retry's fingerprint with the stored one and answers
// CONFLICT naming the first field (in the method's Compare order) that
// differs.
func Check(m *api.Method, stored, current []byte) error {
	var a, b map[string]any
	if json.Unmarshal(stored, &a) != nil || json.Unmarshal(current, &b) != nil {
		return api.Errorf(api.CodeConflict, "the idempotency key was used for a different request")
	}
	for _, f := range m.Idempotency.Compare {
		if !reflect.DeepEqual(a[f], b[f]) {
			return api.Errorf(api.CodeConflict, "the idempotency key was used for a request with a different %s", f).
				WithDetails(map[string]any{"field": f})
		}
	}
	return nil
}

// FingerprintOf is Fingerprint of a typed input (a <Group><Method>Input),
// read through its JSON form, in which absent optional fields are absent.
func FingerprintOf(m *api.Method, in any) []byte {
	raw, err := json.Marshal(in)
	if err != nil {
		panic(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		panic(err)
	}
	return Fingerprint(m, fields)
}
