// Package nodespec writes a daemon-run node's desired spec: the instances
// and the volumes the node holds, rebuilt whole after any change to
// either, with a new generation (gateway.PutSpec); the node's gateway is
// woken once the change commits.
package nodespec

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/gateway"
	"computeplane/internal/notify"
)

// Instance is an instance as the node's runtime reads it.
type Instance struct {
	ID        string          `json:"id"`
	State     string          `json:"state"`
	Hostname  string          `json:"hostname"`
	VCPU      int32           `json:"vcpu"`
	MemoryMiB int64           `json:"memoryMiB"`
	DiskGiB   int64           `json:"diskGiB"`
	Boot      json.RawMessage `json:"boot"`
	UserData  string          `json:"userData,omitempty"`
	Reboots   int32           `json:"reboots"`
	// Sandboxes and warm instances: who the guest is (a claim raises the
	// generation), the volumes it mounts, guest memory in a shared file
	// (fast pause, snapshot, restore), the snapshot it starts from.
	Identity   *agentproto.SpecIdentity `json:"identity,omitempty"`
	Volumes    []agentproto.SpecVolume  `json:"volumes,omitempty"`
	MemoryFile bool                     `json:"memoryFile,omitempty"`
	Restore    string                   `json:"restore,omitempty"`
}

// Spec is the body of a node spec.
type Spec struct {
	Instances []Instance              `json:"instances"`
	Volumes   []agentproto.VolumeSpec `json:"volumes"`
}

// Push rebuilds node's spec in tx and asks for its gateway to be woken
// after the commit (notify.Later).
func Push(ctx context.Context, tx pgx.Tx, node string) error {
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
	spec := Spec{Instances: make([]Instance, 0, len(instances)), Volumes: make([]agentproto.VolumeSpec, 0, len(volumes))}
	for _, r := range instances {
		in := Instance{ID: r.InstanceID, State: r.DesiredState, Hostname: r.Name,
			VCPU: r.Vcpu, MemoryMiB: r.MemoryMib, DiskGiB: r.DiskGib, Boot: r.Boot, UserData: r.UserData.String, Reboots: r.Reboots,
			MemoryFile: r.MemoryFile, Restore: r.RestoreSnapshot.String}
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
		spec.Instances = append(spec.Instances, in)
	}
	for _, v := range volumes {
		spec.Volumes = append(spec.Volumes, agentproto.VolumeSpec{Serial: v.Serial, SizeGiB: v.SizeGib})
	}
	body, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	_, topic, err := gateway.PutSpec(ctx, tx, node, body)
	if err != nil {
		return err
	}
	notify.Later(ctx, topic)
	return nil
}
