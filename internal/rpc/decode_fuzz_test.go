package rpc_test

import (
	"encoding/json"
	"testing"

	"computeplane/gen/api"
	"computeplane/internal/wire"
)

// FuzzDecoders feeds arbitrary bodies to every generated input decoder. A
// decoder must never panic, must either accept or name at least one issue
// with a message, and what it accepts must be accepted again after a round
// trip through its own JSON encoding (the typed input loses nothing the
// rules check).
func FuzzDecoders(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `[]`, `{"tenantId":"acme"}`, `{"tenantId":"acme","kind":"custom","region":"eu-west","idempotencyKey":"k"}`,
		`{"tenantId":"t","name":"n","poolId":"pool_0123456789abcdefghjkmnpqrs","flavor":"f","imageId":"i",` +
			`"warm":{"min":1,"max":2},"env":{"A":"b"},"volumes":[{"name":"v","mountPath":"/d","readOnly":true}],"userData":null}`,
		`{"limit":1e2}`, `{"limit":-1}`, `{"x":{"y":[1,2,{"z":null}]}}`, `{"tenantId":"acme"} trailing`,
		`{"tenantId":"acme","accountId":"pacct_0123456789abcdefghjkmnpqrs","poolId":"pool_0123456789abcdefghjkmnpqrs","idempotencyKey":"k","machineId":"m","offerId":"o"}`,
	} {
		for i := range api.Methods {
			f.Add(uint8(i), []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		m := api.Methods[int(which)%len(api.Methods)]
		obj, issue := wire.ParseObject(body)
		if issue != nil {
			if issue.Message == "" {
				t.Fatalf("%s: empty parse issue", m.FullName)
			}
			return
		}
		var iss wire.Issues
		in := m.Decode(obj, &iss)
		if !iss.Empty() {
			for _, i := range iss.List {
				if i.Message == "" {
					t.Fatalf("%s: issue without a message at %q", m.FullName, i.Path)
				}
			}
			return
		}
		again, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("%s: accepted input does not encode: %v", m.FullName, err)
		}
		obj2, issue := wire.ParseObject(again)
		if issue != nil {
			t.Fatalf("%s: re-encoded input does not parse: %s", m.FullName, issue.Message)
		}
		var iss2 wire.Issues
		m.Decode(obj2, &iss2)
		if !iss2.Empty() {
			t.Fatalf("%s: accepted %s but refused its re-encoding %s: %s", m.FullName, body, again, iss2.First())
		}
	})
}
