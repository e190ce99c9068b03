package nodework

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
)

// A kind has one owner: a second handler for it is a wiring mistake.
func TestRegisterAKindOnce(t *testing.T) {
	h := func(context.Context, pgx.Tx, string, db.Instance, agentproto.InstanceStatus) (bool, error) {
		return false, nil
	}
	var reg Registry
	reg.Register("vps", h)
	reg.Register("sandbox", h)
	assert.Panics(t, func() { reg.Register("vps", h) })
}
