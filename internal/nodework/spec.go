package nodework

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/notify"
	"computeplane/internal/store"
	"computeplane/internal/vmnet"
)

// SpecOffer is a node's spec as a commit wrote it, offered to its
// gateway's topic (notify.OfferLater); Generation is set once the write
// answered (with the commit).
type SpecOffer struct {
	Node       string
	Generation int64
	Spec       agentproto.SpecBody
}

// putSpec is queries/gateway.sql's PutNodeSpec (its generation read back
// from a held write, store.LaterRow, which sqlc's code cannot do).
const putSpec = `INSERT INTO node_specs (node_id, generation, body) VALUES ($1, 1, $2)
ON CONFLICT (node_id) DO UPDATE SET generation = node_specs.generation + 1, body = excluded.body, updated_at = now()
RETURNING generation`

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
	var p store.Pipeline
	r := QueueSpec(ctx, &p, node)
	if err := p.Send(ctx, tx); err != nil {
		return err
	}
	return r.push(ctx, tx, members)
}

// SpecReads are the reads a node's spec is made of (its instances; its
// gateway, last spec and volumes), queued in a pipeline after the
// statements that change them (a create's insert): Push then writes the
// spec as PushSpec does, without a round trip of its own.
type SpecReads struct {
	node                    string
	instances               []db.Instance
	inputs                  db.NodeSpecInputsRow
	instancesErr, inputsErr error
}

// QueueSpec queues node's spec reads in p.
func QueueSpec(ctx context.Context, p *store.Pipeline, node string) *SpecReads {
	r := &SpecReads{node: node}
	p.Queue(func(q *db.Queries) {
		r.instances, r.instancesErr = q.NodeInstances(ctx, pgtype.Text{String: node, Valid: true})
		r.inputs, r.inputsErr = q.NodeSpecInputs(ctx, node)
	})
	return r
}

// Push is PushSpec from the reads, once their pipeline is sent.
func (r *SpecReads) Push(ctx context.Context, tx pgx.Tx) error { return r.push(ctx, tx, true) }

func (r *SpecReads) push(ctx context.Context, tx pgx.Tx, members bool) error {
	q := db.New(tx)
	node, instances, inputs := r.node, r.instances, r.inputs
	if r.instancesErr != nil {
		return r.instancesErr
	}
	if r.inputsErr != nil {
		return fmt.Errorf("nodework: spec for node %s: %w", node, r.inputsErr)
	}
	var err error
	spec := agentproto.SpecBody{Instances: make([]agentproto.InstanceSpec, 0, len(instances))}
	if err := json.Unmarshal(inputs.Volumes, &spec.Volumes); err != nil {
		return err
	}
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
	if spec.Networks, err = privateNetworks(ctx, q, node, instances); err != nil {
		return err
	}
	var before []agentproto.NetworkSpec
	if members && len(inputs.LastSpec) > 0 {
		var last agentproto.SpecBody
		if err := json.Unmarshal(inputs.LastSpec, &last); err != nil {
			return err
		}
		before = last.Networks
	}
	body, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	// The write travels with the transaction's next statement or its
	// COMMIT, and its generation comes back with it: the spec is offered
	// to the node's gateway (when it runs in this process) with the
	// commit's wake, so that the gateway sends it without reading it back.
	offer := &SpecOffer{Node: node, Spec: spec}
	if err := store.LaterRow(ctx, tx, func(r pgx.Row) error { return r.Scan(&offer.Generation) }, putSpec, node, body); err != nil {
		return err
	}
	topic := TopicOf(inputs.SessionGateway)
	if topic != TopicAll {
		// In place of the gateway's wake: a gateway in this process takes
		// the spec and sends it, without the wake's read of every pending
		// spec and command (which would find this one sent); one in
		// another process is woken and reads it. Not offered from a
		// savepoint (the gateway would send a generation that is not
		// there, then skip the next one, which has its number): woken.
		notify.OfferInstead(ctx, tx, topic, offer)
	} else {
		notify.Later(ctx, topic)
	}
	if !members {
		return nil
	}
	pool := ""
	if len(instances) > 0 {
		pool = instances[0].PoolID
	}
	return pushMembers(ctx, tx, node, pool, before, spec.Networks)
}
