package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/store"
)

// Enrollment puts a bare-metal host into a metal-host pool: the node is
// written joining with its driver, and the provisioning workflow starts;
// the workflow's node.join step makes it ready.
type Enrollment struct {
	PoolID       string
	Hostname     string
	Driver       string          // a driver of the registry: qemu, redfish
	DriverConfig json.RawMessage // the driver's configuration (secrets as references)
	Labels       map[string]string
	// Profile and its inputs; empty ProfileID takes MetalHostProfile.
	ProfileID      string
	ProfileVersion int
	Inputs         map[string]any
	StartedBy      string
}

// Enroll writes the node (joining, declared: no node daemon runs on it),
// its metal host record, its place in the authorization projection and
// starts its provisioning workflow, in one transaction.
func Enroll(ctx context.Context, st *store.Store, proj iam.Projection, typePrefix string, e Enrollment) (*api.Workflow, error) {
	if e.Hostname == "" || len(e.Hostname) > 253 {
		return nil, errors.New("workflows: a hostname of 1 to 253 characters is required")
	}
	if e.ProfileID == "" {
		e.ProfileID = MetalHostProfile
	}
	if e.DriverConfig == nil {
		e.DriverConfig = json.RawMessage("{}")
	}
	labels := e.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	rawLabels, err := json.Marshal(labels)
	if err != nil {
		return nil, err
	}
	var out *api.Workflow
	err = st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		pool, err := q.GetPoolForUpdate(ctx, e.PoolID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("workflows: pool %s not found", e.PoolID)
		}
		if err != nil {
			return err
		}
		if pool.Archived || pool.Class != "metal-host" {
			return fmt.Errorf("workflows: pool %s is archived or not a metal-host pool", e.PoolID)
		}
		n, err := q.InsertNode(ctx, db.InsertNodeParams{NodeID: ids.New("node"), PoolID: pool.PoolID, SiteID: pool.SiteID,
			Hostname: e.Hostname, State: "joining", Labels: rawLabels, Declared: true})
		if err != nil {
			return err
		}
		if err := q.InsertMetalHost(ctx, db.InsertMetalHostParams{NodeID: n.NodeID, Driver: e.Driver, Config: e.DriverConfig}); err != nil {
			return err
		}
		if err := proj.Put(ctx, tx, iam.Resource{
			Type: typePrefix + "node", ID: n.NodeID, TenantID: pool.TenantID,
			Parent:     &iam.Ref{Type: typePrefix + "pool", ID: pool.PoolID},
			Attributes: map[string]string{"poolId": pool.PoolID, "siteId": pool.SiteID},
		}); err != nil {
			return err
		}
		inputs := e.Inputs
		if inputs == nil {
			inputs = map[string]any{}
		}
		if _, ok := inputs["hostname"]; !ok {
			inputs["hostname"] = e.Hostname
		}
		out, err = Start(ctx, tx, StartParams{TenantID: pool.TenantID, NodeID: n.NodeID, ProfileID: e.ProfileID,
			ProfileVersion: e.ProfileVersion, Inputs: inputs, StartedBy: e.StartedBy})
		return err
	})
	return out, err
}
