package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/store"
)

func TestProjectionDraftLifecycle(t *testing.T) {
	s, st, _ := newTestService(t)
	ctx := context.Background()
	alice := mustCaller(t, s, KeyRequest{Tenant: "acme", Identity: "alice", Role: RoleMember})
	bob := mustCaller(t, s, KeyRequest{Tenant: "acme", Identity: "bob", Role: RoleMember})
	proj := s.Projection()
	const action = "compute:sandboxes:manage"
	ref := iam.Ref{Type: "compute-sandbox-volume", ID: "vol-1"}
	draft := iam.Resource{Type: ref.Type, ID: ref.ID, TenantID: "acme", Owner: "alice", Draft: true,
		Parent: &iam.Ref{Type: "compute-pool", ID: "pool-1"}, Attributes: map[string]string{"sizeGiB": "10"}}
	get := func() (db.IamResource, error) {
		return st.Queries().IAMGetResource(ctx, db.IAMGetResourceParams{Type: ref.Type, ID: ref.ID})
	}
	absent := func() {
		t.Helper()
		_, err := get()
		require.ErrorIs(t, err, pgx.ErrNoRows)
	}

	// A refused create leaves nothing.
	drafted, err := proj.PutDraft(ctx, draft)
	require.NoError(t, err)
	assert.True(t, drafted)
	row, err := get()
	require.NoError(t, err)
	assert.True(t, row.Draft)
	assert.Equal(t, "alice", row.OwnerID.String)
	assert.Equal(t, "compute-pool/pool-1", row.ParentType.String+"/"+row.ParentID.String)
	var attrs map[string]string
	require.NoError(t, json.Unmarshal(row.Attributes, &attrs))
	assert.Equal(t, map[string]string{"sizeGiB": "10"}, attrs)
	require.ErrorIs(t, s.Require(ctx, bob, action, iam.Resource{Type: ref.Type, ID: ref.ID, TenantID: "acme"}), iam.ErrDenied)
	require.NoError(t, proj.DropDraft(ctx, ref))
	absent()

	// An allowed create becomes real when its transaction commits ...
	drafted, err = proj.PutDraft(ctx, draft)
	require.NoError(t, err)
	assert.True(t, drafted)
	require.NoError(t, s.Require(ctx, alice, action, iam.Resource{Type: ref.Type, ID: ref.ID, TenantID: "acme"}))
	real := draft
	real.Draft = false
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return proj.Put(ctx, tx, real)
	}))
	row, err = get()
	require.NoError(t, err)
	assert.False(t, row.Draft)
	// ... and then neither DropDraft nor a new draft touches it.
	require.NoError(t, proj.DropDraft(ctx, ref))
	other := draft
	other.Owner = "bob"
	drafted, err = proj.PutDraft(ctx, other)
	require.NoError(t, err)
	assert.False(t, drafted, "a real resource holds the id: no draft is written")
	row, err = get()
	require.NoError(t, err)
	assert.False(t, row.Draft)
	assert.Equal(t, "alice", row.OwnerID.String)

	// Put without an owner keeps the recorded one; the call's transaction
	// may come through the context.
	update := real
	update.Owner = ""
	update.Attributes = map[string]string{"sizeGiB": "20"}
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return proj.Put(store.ContextWithTx(ctx, tx), nil, update)
	}))
	row, err = get()
	require.NoError(t, err)
	assert.Equal(t, "alice", row.OwnerID.String)
	require.NoError(t, json.Unmarshal(row.Attributes, &attrs))
	assert.Equal(t, "20", attrs["sizeGiB"])

	// Writes roll back with their transaction.
	rollback := errors.New("rollback")
	err = st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		if err := proj.Delete(ctx, tx, ref); err != nil {
			return err
		}
		return rollback
	})
	require.ErrorIs(t, err, rollback)
	_, err = get()
	require.NoError(t, err, "the rolled-back delete left the resource")

	// Delete removes the resource and its relationships.
	prj := iam.Ref{Type: "compute-project", ID: "prj-1"}
	inPrj := iam.Resource{Type: "compute-pool", ID: "pool-p", TenantID: "acme", Owner: "alice", Parent: &prj}
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		if err := proj.Put(ctx, tx, iam.Resource{Type: prj.Type, ID: prj.ID, TenantID: "acme", Owner: "alice"}); err != nil {
			return err
		}
		if err := proj.Put(ctx, tx, inPrj); err != nil {
			return err
		}
		if err := proj.Relate(ctx, tx, prj, "member", "bob"); err != nil {
			return err
		}
		return proj.Relate(ctx, tx, prj, "member", "bob") // idempotent
	}))
	poolRes := iam.Resource{Type: inPrj.Type, ID: inPrj.ID}
	require.NoError(t, s.Require(ctx, bob, action, poolRes), "bob is a member of the project")
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return proj.Unrelate(ctx, tx, prj, "member", "bob")
	}))
	require.ErrorIs(t, s.Require(ctx, bob, action, poolRes), iam.ErrDenied, "unrelated")
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		if err := proj.Relate(ctx, tx, prj, "member", "bob"); err != nil {
			return err
		}
		return proj.Delete(ctx, tx, prj)
	}))
	require.ErrorIs(t, s.Require(ctx, bob, action, poolRes), iam.ErrDenied, "project deleted")
	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return proj.Put(ctx, tx, iam.Resource{Type: prj.Type, ID: prj.ID, TenantID: "acme", Owner: "alice"})
	}))
	require.ErrorIs(t, s.Require(ctx, bob, action, poolRes), iam.ErrDenied, "relationships went with the project")

	require.NoError(t, st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		return proj.Delete(ctx, tx, ref)
	}))
	absent()

	// Refused writes.
	_, err = proj.PutDraft(ctx, iam.Resource{Type: "sandbox-volume", ID: "x", TenantID: "acme"})
	assert.Error(t, err, "no prefix")
	_, err = proj.PutDraft(ctx, iam.Resource{Type: "compute-sandbox-volume", ID: "x"})
	assert.Error(t, err, "no tenant")
	_, err = proj.PutDraft(ctx, iam.Resource{Type: "compute-sandbox-volume", TenantID: "acme"})
	assert.Error(t, err, "no id")
	assert.Error(t, proj.Put(ctx, nil, real), "no transaction")
	assert.Error(t, proj.Relate(ctx, nil, prj, "", "bob"), "no relation")
}
