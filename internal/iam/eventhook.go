package iam

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"computeplane/gen/api"
	"computeplane/internal/rpc"
	"computeplane/internal/whsig"
)

// EventHookMaxBody bounds the body of one identity event.
const EventHookMaxBody = 64 << 10

// EventHook serves POST /iam/events (the path is configurable): the
// identity service's signed event webhook. A request signed with the
// configured secret by the Standard Webhooks scheme (internal/whsig), no
// more than whsig.Tolerance off this process's clock, is recorded in the
// identity inbox once per event id, and reacted to at once in this process
// (other processes hear it when they drain the inbox). Anything unsigned,
// badly signed or stale is 401. The body format is in docs/identity.md.
type EventHook struct {
	// Key is the secret's key bytes (see EventHookKey).
	Key []byte
	// Record appends the event to the inbox; recorded is false when its id
	// is there already.
	Record func(ctx context.Context, e Event) (recorded bool, err error)
	// React applies a newly recorded event to this process's caches.
	React func(Event)
	Now   func() time.Time
	Log   *slog.Logger
}

// EventHookKey is the key of a configured secret: a whsec_ secret's
// decoded bytes, any other string's bytes as they are.
func EventHookKey(secret string) []byte {
	if k, err := whsig.ParseSecret(secret); err == nil && len(k) > 0 {
		return k
	}
	return []byte(secret)
}

// hookEvent is the body of one identity event.
type hookEvent struct {
	ID         string    `json:"id"`
	Type       string    `json:"type"`
	IdentityID string    `json:"identityId"`
	Session    string    `json:"session"`
	At         time.Time `json:"at"`
}

var (
	hookIDRe   = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	hookTypeRe = regexp.MustCompile(`^[a-z][a-z0-9._-]{0,63}$`)
)

func (h *EventHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		h.fail(w, api.CodeMethodNotAllowed, "only POST is allowed here")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, EventHookMaxBody))
	if err != nil {
		h.fail(w, api.CodeInvalidInput, "the body exceeds 64 KiB or could not be read")
		return
	}
	id, err := whsig.Verify(h.Key, r.Header, body, h.Now())
	if err != nil {
		// Which check failed is no secret: the sender fixes its clock or
		// its secret by it.
		msg := "the request is not signed with the identity events secret"
		if errors.Is(err, whsig.ErrTimestamp) {
			msg = "webhook-timestamp is more than 5 minutes from this server's clock"
		}
		h.fail(w, api.CodeUnauthenticated, msg)
		return
	}
	var e hookEvent
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	switch {
	case dec.Decode(&e) != nil:
		h.fail(w, api.CodeInvalidInput, "the body is not an identity event object")
		return
	case e.ID != id:
		h.fail(w, api.CodeInvalidInput, "id: must equal the webhook-id header")
		return
	case !hookIDRe.MatchString(e.ID):
		h.fail(w, api.CodeInvalidInput, "id: 1 to 128 characters of A-Z, a-z, 0-9 and . _ : -")
		return
	case !hookTypeRe.MatchString(e.Type):
		h.fail(w, api.CodeInvalidInput, "type: a lower-case dotted name such as session.revoked")
		return
	case len(e.IdentityID) > 256 || len(e.Session) > 256 || strings.ContainsRune(e.IdentityID+e.Session, 0):
		h.fail(w, api.CodeInvalidInput, "identityId and session are at most 256 characters")
		return
	}
	if e.At.IsZero() {
		e.At = h.Now()
	}
	ev := Event{ID: e.ID, Type: e.Type, IdentityID: e.IdentityID, Session: e.Session, At: e.At}
	recorded, err := h.Record(r.Context(), ev)
	if err != nil {
		h.Log.WarnContext(r.Context(), "identity event not recorded", "eventId", ev.ID, "error", err.Error())
		h.fail(w, api.CodeUnavailable, "the identity inbox is unavailable; retry later")
		return
	}
	if recorded && h.React != nil {
		h.React(ev)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": ev.ID, "recorded": recorded})
}

// fail answers in the envelope's error format, through its one writer.
func (h *EventHook) fail(w http.ResponseWriter, code api.Code, msg string) {
	e := api.Errorf(code, "%s", msg)
	if code == api.CodeUnavailable {
		e = e.WithDetails(map[string]any{"retryAfterMs": 1000})
	}
	rpc.WriteError(w, h.Log, e)
}
