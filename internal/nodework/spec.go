package nodework

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/notify"
	"computeplane/internal/vmnet"
)

// PushSpec rebuilds node's spec from what the database places there, the
// instances and the volumes the node holds and its VMs' private networks,
// with a new generation, in tx, and asks for its gateway to be woken
// after the commit (notify.Later). When the node joined or left a
// private network, the network's other nodes get a new spec too (their
// peers changed).
func PushSpec(ctx context.Context, tx pgx.Tx, node string) error {
	return pushSpec(ctx, tx, node, true)
}

// pushSpec is PushSpec; members pushes the other nodes of the networks
// node joined or left (a node pushed for a peer's change joined or left
// none itself).
func pushSpec(ctx context.Context, tx pgx.Tx, node string, members bool) error {
	q := db.New(tx)
	nodeID := pgtype.Text{String: node, Valid: true}
	instances, err := q.NodeInstances(ctx, nodeID)
	if err != nil {
		return err
	}
	volumes, err := q.NodeVolumes(ctx, node)
	if err != nil {
		return err
	}
	spec := agentproto.SpecBody{Instances: make([]agentproto.InstanceSpec, 0, len(instances)), Volumes: make([]agentproto.VolumeSpec, 0, len(volumes))}
	for _, r := range instances {
		in := agentproto.InstanceSpec{ID: r.InstanceID, State: r.DesiredState, Hostname: r.Name,
			VCPU: int(r.Vcpu), MemoryMiB: r.MemoryMib, DiskGiB: r.DiskGib, UserData: r.UserData.String, Reboots: int(r.Reboots),
			MemoryFile: r.MemoryFile, Restore: r.RestoreSnapshot.String}
		if len(r.Boot) > 0 {
			if err := json.Unmarshal(r.Boot, &in.Boot); err != nil {
				return err
			}
		}
		if r.IdentityGeneration > 0 {
			in.Hostname = r.Hostname.String
			in.Identity = &agentproto.SpecIdentity{Generation: r.IdentityGeneration, Hostname: r.Hostname.String, MachineID: r.MachineID.String}
			if len(r.Env) > 0 {
				if err := json.Unmarshal(r.Env, &in.Identity.Env); err != nil {
					return err
				}
			}
		}
		if len(r.Volumes) > 0 {
			if err := json.Unmarshal(r.Volumes, &in.Volumes); err != nil {
				return err
			}
		}
		if in.Network, err = vmnet.Spec(r); err != nil {
			return err
		}
		spec.Instances = append(spec.Instances, in)
	}
	for _, v := range volumes {
		spec.Volumes = append(spec.Volumes, agentproto.VolumeSpec{Serial: v.Serial, SizeGiB: v.SizeGib})
	}
	if spec.Networks, err = privateNetworks(ctx, q, node, instances); err != nil {
		return err
	}
	var before []agentproto.NetworkSpec
	if members {
		if before, err = lastNetworks(ctx, q, node); err != nil {
			return err
		}
	}
	_, topic, err := PutSpec(ctx, tx, node, spec)
	if err != nil {
		return err
	}
	notify.Later(ctx, topic)
	if !members {
		return nil
	}
	pool := ""
	if len(instances) > 0 {
		pool = instances[0].PoolID
	}
	return pushMembers(ctx, tx, node, pool, before, spec.Networks)
}
