package rpc_test

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/internal/wire"
)

// FuzzDecoders feeds arbitrary bodies to every generated input decoder. A
// decoder must never panic, must either accept or name at least one issue
// with a message, and what it accepts must be accepted again after a round
// trip through its own JSON encoding (the typed input loses nothing the
// rules check). What it accepts must also be storable: with a database
// (make test sets SERVICE_DATABASE_URL) the accepted input goes to
// PostgreSQL as jsonb and every string in it as text, which refuse what
// business code could not store (a NUL, once).
func FuzzDecoders(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `[]`, `{"tenantId":"acme"}`, `{"tenantId":"acme","kind":"custom","region":"eu-west","idempotencyKey":"k"}`,
		`{"tenantId":"t","name":"n","poolId":"pool_0123456789abcdefghjkmnpqrs","flavor":"f","imageId":"i",` +
			`"warm":{"min":1,"max":2},"env":{"A":"b"},"volumes":[{"name":"v","mountPath":"/d","readOnly":true}],"userData":null}`,
		`{"limit":1e2}`, `{"limit":-1}`, `{"x":{"y":[1,2,{"z":null}]}}`, `{"tenantId":"acme"} trailing`,
		`{"tenantId":"acme","url":"https://example.com/h","events":["*"],"description":"a\u0000b"}`,
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
		if conn := fuzzDB(t); conn != nil {
			if _, err := conn.Exec(t.Context(), "select $1::jsonb", string(again)); err != nil {
				t.Fatalf("%s: accepted %q but PostgreSQL refuses it as jsonb: %v", m.FullName, body, err)
			}
			for _, s := range stringsIn(obj) {
				if _, err := conn.Exec(t.Context(), "select $1::text", s); err != nil {
					t.Fatalf("%s: accepted %q but PostgreSQL refuses its string %q: %v", m.FullName, body, s, err)
				}
			}
		}
	})
}

var (
	fuzzConnOnce sync.Once
	fuzzConn     *pgx.Conn
)

// fuzzDB is one connection to the test cluster per fuzz process, nil when
// no cluster is configured.
func fuzzDB(t *testing.T) *pgx.Conn {
	fuzzConnOnce.Do(func() {
		if url := os.Getenv("SERVICE_DATABASE_URL"); url != "" {
			conn, err := pgx.Connect(context.Background(), url)
			if err != nil {
				t.Fatalf("connect to the test cluster: %v", err)
			}
			fuzzConn = conn
		}
	})
	return fuzzConn
}

// stringsIn returns every string and object key in a decoded JSON value.
func stringsIn(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, stringsIn(e)...)
		}
		return out
	case map[string]any:
		var out []string
		for k, e := range v {
			out = append(append(out, k), stringsIn(e)...)
		}
		return out
	}
	return nil
}
