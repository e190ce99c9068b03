// Package idem is the shared idempotency machinery of creates: the request
// fingerprint a create stores beside what it made, and the comparison that
// answers a retry with the same result or CONFLICT when the same key came
// with a different request. wait never takes part.
package idem

import (
	"encoding/json"
	"errors"
	"reflect"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/internal/ids"
)

// Key is one create's idempotency: the id its key derives, under which the
// create stores what it made, and the fingerprint of its request.
type Key struct {
	Method      *api.Method
	ID          string
	Fingerprint []byte
}

// For derives the Key of a create of method m by caller in tenant under the
// idempotency key, for the typed input in.
func For(m *api.Method, tenant, caller, key string, in any) Key {
	return Key{Method: m, ID: ID(m, tenant, caller, key), Fingerprint: FingerprintOf(m, in)}
}

// ID is the id a create of m derives from its idempotency key: the same
// tenant, caller and key make the same id, so a retry finds what the first
// call made.
func ID(m *api.Method, tenant, caller, key string) string {
	return ids.Derive(m.Idempotency.IDPrefix, tenant, caller, key)
}

// Replay answers the read of the row stored under k.ID (err the read's
// error, stored the row's fingerprint): true when an earlier create with
// the same request made it, so the call answers with that row; CONFLICT
// when the key came with another request; false when there is no row yet;
// any other error is returned.
//
//	existing, err := q.GetVolume(ctx, k.ID)
//	if replay, err := k.Replay(existing.IdemRequest, err); err != nil {
//		return nil, err
//	} else if replay {
//		return output(existing), nil
//	}
func (k Key) Replay(stored []byte, err error) (bool, error) {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	if err := Check(k.Method, stored, k.Fingerprint); err != nil {
		return false, err
	}
	return true, nil
}

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
