// Package supportbundles implements the supportBundles group: an operator
// asks a node's daemon for a support bundle; the daemon collects and
// scrubs it (a supportBundle command); its result, followed here in the
// gateway's transaction, signs a PUT of exactly the size the daemon
// reported (refused when above supportBundles.maxBytes) and sends it in an
// uploadSupportBundle command; that command's result makes the bundle
// ready. Operators fetch ready bundles through a presigned GET and delete
// them from the blob store.
package supportbundles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/blob"
	"computeplane/internal/iam"
	"computeplane/internal/idem"
	"computeplane/internal/nodes"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
	"computeplane/internal/wire"
)

// Bundle states.
const (
	StateCollecting = "collecting"
	StateUploading  = "uploading"
	StateReady      = "ready"
	StateFailed     = "failed"
	StateDeleted    = "deleted"
)

// ResourceType is a bundle's type in the authorization projection (under
// its node).
const ResourceType = "support-bundle"

// Bounds of the work.
const (
	// CommandTTL is how long each command waits for its node.
	CommandTTL = 10 * time.Minute
	// UploadURLTTL is how long the daemon's presigned PUT is good for
	// (the upload command's life and its upload's).
	UploadURLTTL = CommandTTL + 15*time.Minute
	// DownloadURLTTL is how long get's presigned GET is good for.
	DownloadURLTTL = 15 * time.Minute
	// BlobTimeout bounds a call to the blob store inside an API call.
	BlobTimeout = 10 * time.Second
)

// Service implements api.SupportBundlesService. Blob nil is the
// supportBundles option unset: every method answers INVALID_CONFIG.
type Service struct {
	Blob     blob.Store
	MaxBytes int64
	Store    *store.Store // waits re-read through it
}

var create = api.Lookup("/supportBundles/create")

func (s *Service) configured() error {
	if s == nil || s.Blob == nil {
		return api.Errorf(api.CodeInvalidConfig, "support bundles are not configured on this service (the supportBundles option)")
	}
	return nil
}

func notFound(id string) error {
	return api.Errorf(api.CodeNotFound, "support bundle %s not found", id)
}

// objectKey is where a bundle lives in the blob store.
func objectKey(node, bundle string) string { return node + "/" + bundle + ".tar.gz" }

// output is the API's bundle; a bundle whose current command expired
// unanswered reads as failed.
func output(b db.SupportBundle, commandState string) *api.SupportBundle {
	o := &api.SupportBundle{BundleID: b.BundleID, TenantID: b.TenantID, NodeID: b.NodeID, PoolID: b.PoolID, State: b.State,
		MaxBytes: b.MaxBytes, CreatedAt: wire.Time(b.CreatedAt)}
	if b.Error.Valid {
		o.Error = &b.Error.String
	}
	if (b.State == StateCollecting || b.State == StateUploading) && commandState == "expired" {
		o.State = StateFailed
		msg := "the node did not answer before its command expired"
		o.Error = &msg
	}
	if b.SizeBytes.Valid {
		o.SizeBytes = &b.SizeBytes.Int64
	}
	if b.Sha256.Valid {
		o.Sha256 = &b.Sha256.String
	}
	if b.Redactions.Valid {
		o.Redactions = &b.Redactions.Int64
	}
	if b.ReadyAt != nil {
		t := wire.Time(*b.ReadyAt)
		o.ReadyAt = &t
	}
	if b.DeletedAt != nil {
		t := wire.Time(*b.DeletedAt)
		o.DeletedAt = &t
	}
	return o
}

// Create answers supportBundles.create.
func (s *Service) Create(ctx context.Context, in *api.SupportBundlesCreateInput) (*api.SupportBundle, error) {
	if err := s.configured(); err != nil {
		return nil, err
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	k := idem.For(create, in.TenantID, sess.Caller.IdentityID, in.IdempotencyKey, in)
	existing, err := q.GetSupportBundle(ctx, k.ID)
	if replay, err := k.Replay(existing.SupportBundle.IdemRequest, err); err != nil {
		return nil, err
	} else if replay {
		return s.waited(ctx, output(existing.SupportBundle, existing.CommandState), in.Wait)
	}
	n, err := q.GetNode(ctx, in.NodeID)
	if n, err = store.Visible(n, err, n.Owner == in.TenantID, api.Errorf(api.CodeNotFound, "node %s not found", in.NodeID)); err != nil {
		return nil, err
	}
	switch {
	case n.Node.Declared:
		return nil, api.Errorf(api.CodeInvalidState, "node %s is declared, not run by a daemon: it has no daemon to collect a bundle", n.Node.NodeID)
	case n.Node.State == "retired":
		return nil, api.Errorf(api.CodeInvalidState, "node %s is retired", n.Node.NodeID).WithDetails(map[string]any{"state": n.Node.State})
	}
	id := k.ID
	args, _ := json.Marshal(agentproto.SupportBundleArgs{BundleID: id, MaxBytes: s.MaxBytes})
	cmd, topic, err := nodework.EnqueueCommand(ctx, tx, n.Node.NodeID, agentproto.CommandSupportBundle, args, "supportBundles", CommandTTL, time.Now())
	if err != nil {
		return nil, err
	}
	notify.Later(ctx, topic)
	_, err = q.InsertSupportBundle(ctx, db.InsertSupportBundleParams{BundleID: id, TenantID: in.TenantID, NodeID: n.Node.NodeID,
		PoolID: n.Node.PoolID, MaxBytes: s.MaxBytes, ObjectKey: objectKey(n.Node.NodeID, id), CommandID: cmd.CommandID,
		CreatedBy: sess.Caller.IdentityID, IdemRequest: k.Fingerprint})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.Errorf(api.CodeConflict, "idempotencyKey: a concurrent create with this key is in progress; retry")
	}
	if err != nil {
		return nil, err
	}
	if err := sess.Projection().Put(ctx, tx, iam.Resource{Type: sess.TypePrefix() + ResourceType, ID: id, TenantID: in.TenantID,
		Parent: &iam.Ref{Type: sess.TypePrefix() + nodes.ResourceType, ID: n.Node.NodeID}, Owner: sess.Caller.IdentityID}); err != nil {
		return nil, err
	}
	r, err := q.GetSupportBundle(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.waited(ctx, output(r.SupportBundle, r.CommandState), in.Wait)
}

// waited answers now, or after commit once the bundle is ready or failed
// (at most the wait's timeout).
func (s *Service) waited(ctx context.Context, out *api.SupportBundle, wait *api.Wait) (*api.SupportBundle, error) {
	if wait == nil || wait.TimeoutMs == 0 || (out.State != StateCollecting && out.State != StateUploading) {
		return out, nil
	}
	id := out.BundleID
	var topic string
	if r, err := db.New(s.Store.Pool()).GetSupportBundle(ctx, id); err == nil {
		topic = nodework.ResultTopic(r.SupportBundle.CommandID)
	}
	rpc.ThenPoll(ctx, rpc.Poll{Timeout: time.Duration(wait.TimeoutMs) * time.Millisecond, Topic: topic, Initial: out}, func(ctx context.Context) (any, bool, error) {
		r, err := db.New(s.Store.Pool()).GetSupportBundle(ctx, id)
		if err != nil {
			return nil, false, nil
		}
		o := output(r.SupportBundle, r.CommandState)
		return o, o.State != StateCollecting && o.State != StateUploading, nil
	})
	return out, nil
}

func (s *Service) load(ctx context.Context, q *db.Queries, tenant, id string) (db.GetSupportBundleRow, error) {
	r, err := q.GetSupportBundle(ctx, id)
	return store.Visible(r, err, r.SupportBundle.TenantID == tenant, notFound(id))
}

// Get answers supportBundles.get, with a presigned GET when ready.
func (s *Service) Get(ctx context.Context, in *api.SupportBundlesGetInput) (*api.SupportBundle, error) {
	if err := s.configured(); err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	r, err := s.load(ctx, q, in.TenantID, in.BundleID)
	if err != nil {
		return nil, err
	}
	o := output(r.SupportBundle, r.CommandState)
	if o.State == StateReady {
		// Signing is local: no call to the blob store.
		p, err := s.Blob.PresignGet(ctx, r.SupportBundle.ObjectKey, DownloadURLTTL)
		if err != nil {
			return nil, err
		}
		exp := wire.Time(p.ExpiresAt)
		o.DownloadURL, o.DownloadExpiresAt = &p.URL, &exp
	}
	return o, nil
}

// List answers supportBundles.list.
func (s *Service) List(ctx context.Context, in *api.SupportBundlesListInput) (*api.SupportBundleList, error) {
	if err := s.configured(); err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var node pgtype.Text
	if in.NodeID != nil {
		node = pgtype.Text{String: *in.NodeID, Valid: true}
	}
	rows, err := q.ListSupportBundles(ctx, db.ListSupportBundlesParams{TenantID: in.TenantID, NodeID: node, IncludeDeleted: in.IncludeDeleted})
	if err != nil {
		return nil, err
	}
	out := &api.SupportBundleList{Items: make([]api.SupportBundle, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, *output(r.SupportBundle, r.CommandState))
	}
	return out, nil
}

// Delete answers supportBundles.delete: the archive goes from the blob
// store first (a store that does not answer changes nothing), then the
// bundle is marked deleted.
func (s *Service) Delete(ctx context.Context, in *api.SupportBundlesDeleteInput) (*api.SupportBundle, error) {
	if err := s.configured(); err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := q.LockSupportBundle(ctx, in.BundleID); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	r, err := s.load(ctx, q, in.TenantID, in.BundleID)
	if err != nil {
		return nil, err
	}
	o := output(r.SupportBundle, r.CommandState)
	switch o.State {
	case StateDeleted:
		return o, nil
	case StateUploading:
		return nil, api.Errorf(api.CodeInvalidState, "support bundle %s is being uploaded; delete it once it is ready or failed", in.BundleID).
			WithDetails(map[string]any{"state": o.State})
	}
	bctx, cancel := context.WithTimeout(ctx, BlobTimeout)
	defer cancel()
	if err := s.Blob.Delete(bctx, r.SupportBundle.ObjectKey); err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "the support bundle store did not answer; nothing was deleted, retry").
			WithDetails(map[string]any{"retryAfterMs": 5000})
	}
	if err := q.DeleteSupportBundleRow(ctx, in.BundleID); err != nil {
		return nil, err
	}
	r, err = q.GetSupportBundle(ctx, in.BundleID)
	if err != nil {
		return nil, err
	}
	return output(r.SupportBundle, r.CommandState), nil
}

// RegisterResults makes reg follow the results of bundle commands: s
// signs the uploads.
func RegisterResults(reg *nodework.Registry, s *Service) {
	reg.RegisterResult(agentproto.CommandSupportBundle, s.collected)
	reg.RegisterResult(agentproto.CommandUploadSupportBundle, s.uploaded)
}

func failed(ctx context.Context, q *db.Queries, id, why string) error {
	return q.FinishSupportBundle(ctx, db.FinishSupportBundleParams{BundleID: id, State: StateFailed, Error: pgtype.Text{String: why, Valid: true}})
}

// collected follows a collect command: a bundle within maxBytes goes on
// to its upload (a PUT signed for exactly its size), any other is failed.
func (s *Service) collected(ctx context.Context, tx pgx.Tx, node string, r *agentproto.Result) (bool, error) {
	q := db.New(tx)
	b, err := q.SupportBundleByCommand(ctx, r.ID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && b.State != StateCollecting) {
		return false, nil // deleted meanwhile
	}
	if err != nil {
		return false, err
	}
	if !r.OK {
		return false, failed(ctx, q, b.BundleID, "the node: "+r.Error)
	}
	var out agentproto.SupportBundleOutput
	if err := json.Unmarshal(r.Output, &out); err != nil {
		return false, failed(ctx, q, b.BundleID, "the node's answer: "+err.Error())
	}
	if out.SizeBytes > b.MaxBytes {
		return false, failed(ctx, q, b.BundleID, fmt.Sprintf("the bundle is %d bytes, above maxBytes %d", out.SizeBytes, b.MaxBytes))
	}
	if s.configured() != nil {
		return false, failed(ctx, q, b.BundleID, "support bundles are not configured on the gateway that received the bundle")
	}
	put, err := s.Blob.PresignPut(ctx, b.ObjectKey, out.SizeBytes, UploadURLTTL)
	if err != nil {
		return false, failed(ctx, q, b.BundleID, "signing the upload: "+err.Error())
	}
	headers := map[string]string{}
	for k := range put.Headers {
		headers[k] = put.Headers.Get(k)
	}
	args, _ := json.Marshal(agentproto.UploadSupportBundleArgs{BundleID: b.BundleID, URL: put.URL, Headers: headers,
		SizeBytes: out.SizeBytes, SHA256: out.SHA256, MaxBytes: b.MaxBytes})
	cmd, topic, err := nodework.EnqueueCommand(ctx, tx, node, agentproto.CommandUploadSupportBundle, args, "supportBundles", CommandTTL, time.Now())
	if err != nil {
		return false, err
	}
	notify.Later(ctx, topic)
	return false, q.CollectedSupportBundle(ctx, db.CollectedSupportBundleParams{BundleID: b.BundleID, SizeBytes: pgtype.Int8{Int64: out.SizeBytes, Valid: true},
		Sha256: pgtype.Text{String: out.SHA256, Valid: true}, Redactions: pgtype.Int8{Int64: int64(out.Redactions), Valid: true}, UploadCommandID: cmd.CommandID})
}

// uploaded follows an upload command: the bundle is ready or failed.
func (s *Service) uploaded(ctx context.Context, tx pgx.Tx, _ string, r *agentproto.Result) (bool, error) {
	q := db.New(tx)
	b, err := q.SupportBundleByCommand(ctx, r.ID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && b.State != StateUploading) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !r.OK {
		return false, failed(ctx, q, b.BundleID, "the node's upload: "+r.Error)
	}
	return false, q.FinishSupportBundle(ctx, db.FinishSupportBundleParams{BundleID: b.BundleID, State: StateReady})
}
