package nodework_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/nodework"
	"computeplane/internal/uow"
)

// TestASpecIsOfferedOnlyFromTheOutermostTransaction: a spec pushed in the
// transaction itself is offered to its gateway with the generation the
// commit wrote; one pushed in a savepoint that is rolled back is not
// offered (its generation is undone, the offer would not be) and its
// gateway is woken instead; the offer stands for the gateway's wake.
func TestASpecIsOfferedOnlyFromTheOutermostTransaction(t *testing.T) {
	st := fixture(t)
	ctx := t.Context()
	_, err := st.Pool().Exec(ctx, `update nodes set session_gateway = 'gw-1' where node_id = 'n1'`)
	require.NoError(t, err)

	u, err := uow.Run(ctx, st, false, func(ctx context.Context, u *uow.Unit) error {
		sp, err := u.Tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := nodework.PushSpec(ctx, sp, "n1"); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	})
	require.NoError(t, err)
	assert.Empty(t, u.Offers(), "a rolled-back savepoint's spec is not offered")
	assert.Equal(t, []string{nodework.GatewayTopic("gw-1")}, u.Wakes(), "its gateway is woken instead")
	var gens int
	require.NoError(t, st.Pool().QueryRow(ctx, `select count(*) from node_specs where node_id = 'n1'`).Scan(&gens))
	assert.Zero(t, gens, "the savepoint's spec was rolled back")

	u, err = uow.Run(ctx, st, false, func(ctx context.Context, u *uow.Unit) error {
		return nodework.PushSpec(ctx, u.Tx, "n1")
	})
	require.NoError(t, err)
	offers := u.Offers()
	require.Len(t, offers, 1)
	assert.Equal(t, nodework.GatewayTopic("gw-1"), offers[0].Topic)
	assert.True(t, offers[0].Instead, "offered in place of the gateway's wake")
	assert.Empty(t, u.Wakes(), "no wake besides the offer")
	offer, ok := offers[0].Value.(*nodework.SpecOffer)
	require.True(t, ok)
	var gen int64
	require.NoError(t, st.Pool().QueryRow(ctx, `select generation from node_specs where node_id = 'n1'`).Scan(&gen))
	assert.Equal(t, gen, offer.Generation, "the offer carries the committed generation")
}
