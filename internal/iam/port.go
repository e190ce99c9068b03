// Package iam is the identity port: what the service asks of the external
// identity service (authenticate a credential, decide an action on a
// resource, keep the authorization projection and relationships, hand usage
// to billing) and the caches and envelope gate built on it. Adapters
// implement Port; the embedded adapter (internal/iam/embedded) keeps
// everything in the service's own PostgreSQL.
package iam

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/internal/store"
)

// Credential is what a caller presented, with the address the host verified.
type Credential struct {
	// Token is the bearer token (API key, session token or session JWT) or
	// the session cookie's value.
	Token string
	// Cookie is set when Token came from the identity session cookie.
	Cookie bool
	// SourceIP is the caller's address as verified by the host (see
	// SourceIP); invalid when the host has none.
	SourceIP netip.Addr
	// RequestID is forwarded to the identity service.
	RequestID string
}

// Caller is an authenticated identity. The session id is kept for the
// caches and never leaves the service.
type Caller struct {
	IdentityID   string
	IdentityKind string // user, service, agent
	TenantID     string
	SessionKind  string // api-key, session, jwt
	MFA          bool
	AgentID      string // set for delegated agent sessions
	DelegationID string // set for delegated agent sessions
	// Session identifies the session for the allow cache; never returned.
	Session string
}

// Resource is an object of the authorization projection.
type Resource struct {
	// Type carries the configured prefix (compute-site, compute-fleet ...).
	Type     string
	ID       string
	TenantID string
	Parent   *Ref
	// Owner is the identity that created it; owners manage their own.
	Owner      string
	Attributes map[string]string
	// Draft marks a resource written only so that a create can be decided
	// on it; it becomes real when the create commits.
	Draft bool
}

// AttrShared is the attribute ("true") that makes a root-tenant resource
// readable by every tenant, as shared sites are.
const AttrShared = "shared"

// Ref names a resource by type and id.
type Ref struct {
	Type, ID string
}

// Decision errors. Adapters return them (possibly wrapped); the gate maps
// them to the envelope's codes.
var (
	// ErrUnauthenticated: the credential is unknown, revoked or expired.
	ErrUnauthenticated = errors.New("iam: unauthenticated")
	// ErrDenied: the identity may not do this.
	ErrDenied = errors.New("iam: access denied")
	// ErrUnavailable: the identity service cannot be reached; nothing changed.
	ErrUnavailable = errors.New("iam: unavailable")
)

// ConfirmationRequired is the refusal of an action a delegated agent session
// holds for confirmation.
type ConfirmationRequired struct {
	ConfirmationID string
	ExpiresAt      time.Time // zero when it does not expire
	Action         string
	Resource       Ref
}

func (e *ConfirmationRequired) Error() string {
	return "iam: confirmation required for " + e.Action + " on " + e.Resource.Type + "/" + e.Resource.ID
}

// Port is the identity service as the control plane uses it.
type Port interface {
	// RootTenant is the tenant that owns platform resources.
	RootTenant() string
	// Authenticate turns a credential into a caller (ErrUnauthenticated
	// when it is not valid).
	Authenticate(ctx context.Context, cred Credential) (*Caller, error)
	// Require decides a mutation; it is never cached.
	Require(ctx context.Context, c *Caller, action string, r Resource) error
	// Authorize decides a read; the gate caches its allows per session.
	Authorize(ctx context.Context, c *Caller, action string, r Resource) error
	// Projection keeps the resources decisions are made on.
	Projection() Projection
	// Billing hands usage windows to billing.
	Billing() Billing
}

// DraftRequirer is a Port that writes a create's draft (PutDraft) and
// decides the create (Require on target) in one round trip: the decision's
// reads travel in one pipeline with the draft, and nothing is cached.
// The error is the draft's failure (nothing decided); the decision is in
// the DraftOutcome.
type DraftRequirer interface {
	PutDraftRequire(ctx context.Context, draft Resource, c *Caller, action string, target Resource) (DraftOutcome, error)
}

// HeadDrafter is a DraftRequirer whose projection is in the call's own
// database: the draft's write and what the decision reads are queued on p,
// which the gate puts at the head of the call's transaction's first
// pipeline (store.Head), and outcome answers as PutDraftRequire would once
// p's results came. ok false: this port cannot (nothing was queued).
// outcome answers ErrNeedsReads when the decision needs a read p did not
// carry: the gate then admits the call the way it did without a head.
type HeadDrafter interface {
	QueueDraftRequire(p *store.Pipeline, draft Resource, c *Caller, action string, target Resource) (outcome func(ctx context.Context) (DraftOutcome, error), ok bool)
}

// ErrNeedsReads is a HeadDrafter's decision that needs more than its head
// read (a delegation, a project membership, a parent resource).
var ErrNeedsReads = errors.New("iam: the decision needs reads its head did not carry")

// DraftOutcome is what PutDraftRequire did. Drafted false (a real
// resource holds the id) leaves the decision unmade and Refusal nil;
// Drafted true carries Require's answer in Refusal (nil: allowed).
type DraftOutcome struct {
	Drafted bool
	Refusal error
	// Existing is, with Drafted false, the real resource holding the id
	// when the port read it (a HeadDrafter does).
	Existing *Resource
}

// Projection is the authorization projection and its relationships. Writes
// take the transaction of the call, so they commit or roll back with it.
type Projection interface {
	// PutDraft writes a draft resource outside any call transaction, so the
	// decision can be made on it; DropDraft removes it after a refusal. It
	// answers false, writing nothing, when a real resource holds the id.
	PutDraft(ctx context.Context, r Resource) (bool, error)
	// Get returns the resource, nil when the projection does not hold it.
	Get(ctx context.Context, r Ref) (*Resource, error)
	DropDraft(ctx context.Context, r Ref) error
	// Put writes (or makes real) a resource in the call's transaction.
	Put(ctx context.Context, tx pgx.Tx, r Resource) error
	// Delete removes a resource in the call's transaction.
	Delete(ctx context.Context, tx pgx.Tx, r Ref) error
	// Relate and Unrelate keep relationships such as project membership
	// (relation member of an identity on compute-project/{id}).
	Relate(ctx context.Context, tx pgx.Tx, r Ref, relation, identityID string) error
	Unrelate(ctx context.Context, tx pgx.Tx, r Ref, relation, identityID string) error
	// Related lists the identities related to r by relation, by id.
	Related(ctx context.Context, tx pgx.Tx, r Ref, relation string) ([]string, error)
}

// Usage outcomes of the billing bridge.
const (
	OutcomeRecorded     = "recorded"
	OutcomeDuplicate    = "duplicate"
	OutcomeReattributed = "reattributed"
	OutcomeDeadLettered = "dead-lettered"
)

// UsageWindow is one hourly usage window handed to billing.
type UsageWindow struct {
	// Key is cmp:<allocationId>:<windowStartMs>.
	Key        string
	TenantID   string
	Meter      string
	Quantity   float64
	Start, End time.Time
	Tags       map[string]string
}

// Billing is the bridge usage windows cross to billing.
type Billing interface {
	// Record hands a window over by its idempotency key and answers the
	// outcome (recorded, duplicate, reattributed or dead-lettered).
	Record(ctx context.Context, w UsageWindow) (string, error)
}

// Event is an identity-service event drained from the inbox.
type Event struct {
	ID         string
	Type       string // e.g. credential.revoked, session.revoked
	IdentityID string
	Session    string
	At         time.Time
}

// Inbox yields identity events; workers drain it and react (drop caches,
// close streams and tunnels).
type Inbox interface {
	Next(ctx context.Context, after string, limit int) ([]Event, error)
}
