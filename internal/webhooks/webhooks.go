// Package webhooks implements the webhooks group, per-tenant signed event
// subscriptions, and the engine that delivers them.
//
// The API (Service) keeps webhooks and their delivery queue in PostgreSQL
// (migrations/00009_webhooks.sql). The engine (Engine) has two steps that
// a worker runs under its lease: FanOut reads the outbox in visibility
// order after its durable cursor and queues one pending delivery per
// matching active webhook; Deliver claims due deliveries, POSTs them signed
// per Standard Webhooks and records the outcome (the specification's
// delivery state table). docs/webhooks.md describes the receiver's side and
// the decisions the specification leaves open.
//
// Decisions beyond the specification's words:
//   - Decisions are made on compute-tenant (the catalog); webhooks are not
//     in the authorization projection. Audit rows name the webhook
//     (compute-webhook) or, for redeliver, the delivery
//     (compute-webhook-delivery).
//   - "Committed after the webhook's creation": an event is delivered when
//     its transaction is not visible in the snapshot of the statement that
//     wrote the webhook, i.e. had not committed when the webhook was
//     written. An event committing in the few milliseconds between that
//     statement and the create's commit is delivered (never lost); one
//     committed before it never is. Re-activation (update active true)
//     takes a new snapshot the same way: events committed while paused
//     are not delivered.
//   - update naming no field is INVALID_INPUT; values equal to the stored
//     ones return the webhook unchanged (no new version). Every change,
//     rotateSecret and a pause by 410 Gone included, raises version.
//   - rotateSecret keeps at most one previous secret: rotating again
//     during an overlap drops the older one.
//   - ping of a paused webhook queues the ping, which the delivery worker
//     cancels (state table); redeliver of a pending delivery is
//     INVALID_STATE; redeliver clears the last status and error with the
//     attempt count.
//   - A delete answers NOT_FOUND once the webhook is gone.
package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Delivery states.
const (
	StatePending   = "pending"
	StateDelivered = "delivered"
	StateDead      = "dead"
	StateCancelled = "cancelled"
)

// Id prefixes.
const (
	webhookPrefix  = "whk"
	deliveryPrefix = "dlv"
	eventPrefix    = "evt"
)

// Service implements api.WebhooksService.
type Service struct {
	opt   Options
	seal  *sealer
	types []api.EventSpec
	now   func() time.Time
}

var _ api.WebhooksService = (*Service)(nil)

// New returns the webhooks service of a deployment.
func New(o Options) *Service {
	return &Service{opt: o, seal: newSealer(o.Key), types: o.eventTypes(), now: o.clock()}
}

func optTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := wire.Time(*t)
	return &s
}

func notFound(id string) error { return api.Errorf(api.CodeNotFound, "webhook %s not found", id) }

// output renders a webhook without its secrets; an overlap that has ended
// reads as none.
func (s *Service) output(r db.Webhook) *api.Webhook {
	w := &api.Webhook{
		TenantID: r.TenantID, WebhookID: r.WebhookID, URL: r.Url, Events: r.Events, Description: r.Description,
		Active: r.Active, Version: r.Version, CreatedAt: wire.Time(r.CreatedAt), UpdatedAt: wire.Time(r.UpdatedAt),
	}
	if w.Events == nil {
		w.Events = []string{}
	}
	if r.PreviousExpiresAt != nil && r.PreviousExpiresAt.After(s.now()) {
		w.PreviousSecretExpiresAt = optTime(r.PreviousExpiresAt)
	}
	return w
}

func deliveryOutput(r db.WebhookDelivery) *api.Delivery {
	d := &api.Delivery{
		DeliveryID: r.DeliveryID, WebhookID: r.WebhookID, EventID: r.EventID, EventType: r.EventType,
		State: r.State, Attempts: int64(r.Attempts), NextAttemptAt: optTime(r.NextAttemptAt),
		LastAttemptAt: optTime(r.LastAttemptAt), CreatedAt: wire.Time(r.CreatedAt),
	}
	if r.LastStatus.Valid {
		v := int64(r.LastStatus.Int32)
		d.LastStatus = &v
	}
	if r.LastError.Valid {
		d.LastError = &r.LastError.String
	}
	return d
}

// audited makes the audit row name the webhook (or delivery) rather than
// the tenant the call was decided on.
func audited(sess *iam.Session, typ, id, tenant string) {
	sess.Resource = iam.Resource{Type: sess.TypePrefix() + typ, ID: id, TenantID: tenant}
}

// owned starts a call on one webhook: it reads the tenant's webhook,
// locked for a change when lock is set (absent or another tenant's is
// NOT_FOUND, rule 8), and names it as the call's audited resource.
func owned(ctx context.Context, tenant, id string, lock bool) (*iam.Session, *db.Queries, db.Webhook, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, nil, db.Webhook{}, err
	}
	var row db.Webhook
	if lock {
		row, err = q.GetWebhookForUpdate(ctx, id)
	} else {
		row, err = q.GetWebhook(ctx, id)
	}
	if row, err = store.Visible(row, err, row.TenantID == tenant, notFound(id)); err != nil {
		return nil, nil, db.Webhook{}, err
	}
	audited(sess, "webhook", row.WebhookID, row.TenantID)
	return sess, q, row, nil
}

// Create answers webhooks.create: patterns and URL checked (rules 1, 2),
// the tenant's limit (rule 3), no idempotency key (rule 4), the signing
// secret returned once and stored sealed.
func (s *Service) Create(ctx context.Context, in *api.WebhooksCreateInput) (*api.WebhookWithSecret, error) {
	if err := s.checkPatterns(in.Events); err != nil {
		return nil, err
	}
	if err := CheckURL(in.URL, s.opt.AllowPrivateTargets); err != nil {
		return nil, err
	}
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if err := q.LockTenantWebhooks(ctx, in.TenantID); err != nil {
		return nil, err
	}
	n, err := q.CountTenantWebhooks(ctx, in.TenantID)
	if err != nil {
		return nil, err
	}
	if limit := s.opt.maxPerTenant(); n >= int64(limit) {
		return nil, api.Errorf(api.CodeQuotaExceeded, "tenant %s has %d webhooks, the most it may hold", in.TenantID, n).
			WithDetails(map[string]any{"limit": limit})
	}
	id := ids.New(webhookPrefix)
	secret, key, err := newSecret()
	if err != nil {
		return nil, err
	}
	nonce, sealed, err := s.seal.seal(id, 1, key)
	if err != nil {
		return nil, err
	}
	desc := ""
	if in.Description != nil {
		desc = *in.Description
	}
	row, err := q.InsertWebhook(ctx, db.InsertWebhookParams{
		WebhookID: id, TenantID: in.TenantID, Url: in.URL, Events: in.Events, Description: desc,
		SecretNonce: nonce, SecretSealed: sealed, CreatedBy: sess.Caller.IdentityID, Now: s.now(),
	})
	if err != nil {
		return nil, err
	}
	audited(sess, "webhook", id, in.TenantID)
	return &api.WebhookWithSecret{Webhook: *s.output(row), Secret: secret}, nil
}

// List answers webhooks.list: the tenant's webhooks oldest first.
func (s *Service) List(ctx context.Context, in *api.WebhooksListInput) (*api.WebhookList, error) {
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.ListWebhooks(ctx, in.TenantID)
	if err != nil {
		return nil, err
	}
	out := &api.WebhookList{Items: make([]api.Webhook, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, *s.output(r))
	}
	return out, nil
}

// Get answers webhooks.get.
func (s *Service) Get(ctx context.Context, in *api.WebhooksGetInput) (*api.Webhook, error) {
	_, _, row, err := owned(ctx, in.TenantID, in.WebhookID, false)
	if err != nil {
		return nil, err
	}
	return s.output(row), nil
}

// Update answers webhooks.update: url and patterns checked as on create;
// pausing cancels the pending deliveries; re-activating delivers only what
// commits after it.
func (s *Service) Update(ctx context.Context, in *api.WebhooksUpdateInput) (*api.Webhook, error) {
	if in.URL == nil && in.Events == nil && in.Description == nil && in.Active == nil {
		return nil, api.Errorf(api.CodeInvalidInput, "no change named: give url, events, description or active")
	}
	if in.Events != nil {
		if err := s.checkPatterns(in.Events); err != nil {
			return nil, err
		}
	}
	if in.URL != nil {
		if err := CheckURL(*in.URL, s.opt.AllowPrivateTargets); err != nil {
			return nil, err
		}
	}
	_, q, row, err := owned(ctx, in.TenantID, in.WebhookID, true)
	if err != nil {
		return nil, err
	}
	p := db.UpdateWebhookParams{
		WebhookID: row.WebhookID, Url: row.Url, Events: row.Events, Description: row.Description, Active: row.Active,
	}
	if in.URL != nil {
		p.Url = *in.URL
	}
	if in.Events != nil {
		p.Events = in.Events
	}
	if in.Description != nil {
		p.Description = *in.Description
	}
	if in.Active != nil {
		p.Active = *in.Active
	}
	if p.Url == row.Url && slices.Equal(p.Events, row.Events) && p.Description == row.Description && p.Active == row.Active {
		return s.output(row), nil
	}
	p.Reactivate = p.Active && !row.Active
	p.Now = s.now()
	updated, err := q.UpdateWebhook(ctx, p)
	if err != nil {
		return nil, err
	}
	if row.Active && !p.Active {
		if _, err := q.CancelPendingDeliveries(ctx, db.CancelPendingDeliveriesParams{WebhookID: row.WebhookID, Now: p.Now}); err != nil {
			return nil, err
		}
	}
	return s.output(updated), nil
}

// RotateSecret answers webhooks.rotateSecret (rule 5): a new secret, shown
// once; the current one keeps signing for keepPreviousSeconds.
func (s *Service) RotateSecret(ctx context.Context, in *api.WebhooksRotateSecretInput) (*api.WebhookWithSecret, error) {
	_, q, row, err := owned(ctx, in.TenantID, in.WebhookID, true)
	if err != nil {
		return nil, err
	}
	secret, key, err := newSecret()
	if err != nil {
		return nil, err
	}
	gen := row.SecretGen + 1
	nonce, sealed, err := s.seal.seal(row.WebhookID, gen, key)
	if err != nil {
		return nil, err
	}
	now := s.now()
	p := db.RotateWebhookSecretParams{WebhookID: row.WebhookID, SecretGen: gen, SecretNonce: nonce, SecretSealed: sealed, Now: now}
	if in.KeepPreviousSeconds > 0 {
		until := now.Add(time.Duration(in.KeepPreviousSeconds) * time.Second)
		p.PreviousGen = pgtype.Int8{Int64: row.SecretGen, Valid: true}
		p.PreviousNonce, p.PreviousSealed, p.PreviousExpiresAt = row.SecretNonce, row.SecretSealed, &until
	}
	updated, err := q.RotateWebhookSecret(ctx, p)
	if err != nil {
		return nil, err
	}
	return &api.WebhookWithSecret{Webhook: *s.output(updated), Secret: secret}, nil
}

// Delete answers webhooks.delete: the webhook with its delivery queue and
// history.
func (s *Service) Delete(ctx context.Context, in *api.WebhooksDeleteInput) (*api.WebhookDeleted, error) {
	_, q, row, err := owned(ctx, in.TenantID, in.WebhookID, false)
	if err != nil {
		return nil, err
	}
	n, err := q.DeleteWebhook(ctx, row.WebhookID)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, notFound(in.WebhookID) // deleted by a concurrent call
	}
	return &api.WebhookDeleted{Deleted: true}, nil
}

// pingModule publishes webhook.ping in the event catalog.
const pingModule = "webhooks"

// Ping answers webhooks.ping (rule 6): a webhook.ping delivery due now,
// never written to the outbox.
func (s *Service) Ping(ctx context.Context, in *api.WebhooksPingInput) (*api.Delivery, error) {
	_, q, row, err := owned(ctx, in.TenantID, in.WebhookID, false)
	if err != nil {
		return nil, err
	}
	now := s.now()
	eventID := ids.New(eventPrefix)
	data, err := json.Marshal(api.WebhookPingPayload{WebhookID: row.WebhookID})
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(outbox.CloudEvent{
		SpecVersion: "1.0", ID: eventID, Source: outbox.SourcePrefix + pingModule, Type: api.EventWebhookPing,
		Subject: row.WebhookID, Time: wire.Time(now), DataContentType: "application/json", Data: data,
		TenantID: row.TenantID,
	})
	if err != nil {
		return nil, err
	}
	d, err := q.InsertDelivery(ctx, db.InsertDeliveryParams{
		DeliveryID: ids.New(deliveryPrefix), WebhookID: row.WebhookID, TenantID: row.TenantID, EventID: eventID,
		EventType: api.EventWebhookPing, EventTime: now, Body: body, Now: now,
	})
	if err != nil {
		return nil, err
	}
	return deliveryOutput(d), nil
}

// Deliveries answers webhooks.deliveries: newest first, optionally one
// state.
func (s *Service) Deliveries(ctx context.Context, in *api.WebhooksDeliveriesInput) (*api.DeliveryList, error) {
	_, q, _, err := owned(ctx, in.TenantID, in.WebhookID, false)
	if err != nil {
		return nil, err
	}
	p := db.ListDeliveriesParams{WebhookID: in.WebhookID, MaxRows: int32(in.Limit)}
	if in.State != nil {
		p.State = pgtype.Text{String: *in.State, Valid: true}
	}
	rows, err := q.ListDeliveries(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &api.DeliveryList{Items: make([]api.Delivery, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, *deliveryOutput(r))
	}
	return out, nil
}

// Redeliver answers webhooks.redeliver (rule 7): a delivered, dead or
// cancelled delivery becomes pending, due now, attempts reset, same id.
func (s *Service) Redeliver(ctx context.Context, in *api.WebhooksRedeliverInput) (*api.Delivery, error) {
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	missing := api.Errorf(api.CodeNotFound, "delivery %s not found", in.DeliveryID)
	d, err := q.GetDelivery(ctx, in.DeliveryID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, missing
	case err != nil:
		return nil, err
	case d.TenantID != in.TenantID:
		return nil, missing
	}
	// The webhook first, as every writer of both does.
	_, _, w, err := owned(ctx, in.TenantID, d.WebhookID, true)
	if err != nil {
		return nil, missing
	}
	if !w.Active {
		return nil, api.Errorf(api.CodeNotFound, "delivery %s not found: its webhook %s is paused", in.DeliveryID, w.WebhookID)
	}
	audited(sess, "webhook-delivery", d.DeliveryID, d.TenantID)
	r, err := q.RedeliverDelivery(ctx, db.RedeliverDeliveryParams{DeliveryID: d.DeliveryID, Now: s.now()})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeInvalidState, "delivery %s is still pending", d.DeliveryID)
	}
	if err != nil {
		return nil, err
	}
	return deliveryOutput(r), nil
}

// EventTypes answers webhooks.eventTypes: the event catalog, each type
// marked with whether its publishing module is served in this deployment.
func (s *Service) EventTypes(_ context.Context, _ *api.WebhooksEventTypesInput) (*api.EventTypeList, error) {
	out := &api.EventTypeList{Items: make([]api.EventType, 0, len(s.types))}
	for _, e := range s.types {
		out.Items = append(out.Items, api.EventType{Type: e.Type, Subject: e.Subject, Module: e.Module, Description: e.Description,
			Served: Served(e.Module)})
	}
	return out, nil
}
