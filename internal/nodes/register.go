package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/outbox"
	"computeplane/internal/store"
)

// Registration enters a node with a declared capacity: an operator's way to
// put a host in a pool without a node daemon (and what tests and
// benchmarks use). The node is ready at once and never down for want of a
// session; it is marked declared.
type Registration struct {
	PoolID    string
	Hostname  string
	VCPU      int32
	MemoryMiB int64
	DiskGiB   int64
	GPUModel  string
	GPUs      int32
	Labels    map[string]string
}

// Register writes the node, its place in the authorization projection
// (owned by the pool's tenant) and node.registered, in one transaction.
func Register(ctx context.Context, st *store.Store, proj iam.Projection, typePrefix string, r Registration) (*api.Node, error) {
	if r.Hostname == "" || len(r.Hostname) > 253 {
		return nil, errors.New("nodes: a hostname of 1 to 253 characters is required")
	}
	if r.VCPU < 0 || r.MemoryMiB < 0 || r.DiskGiB < 0 || r.GPUs < 0 || (r.GPUs > 0) != (r.GPUModel != "") {
		return nil, errors.New("nodes: capacities are at least 0, and GPUs come with their model")
	}
	labels := r.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	raw, err := json.Marshal(labels)
	if err != nil {
		return nil, err
	}
	var out *api.Node
	err = st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		q := db.New(tx)
		pool, err := q.GetPoolForUpdate(ctx, r.PoolID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("nodes: pool %s not found", r.PoolID)
		}
		if err != nil {
			return err
		}
		if pool.Archived {
			return fmt.Errorf("nodes: pool %s is archived", r.PoolID)
		}
		n, err := q.InsertNode(ctx, db.InsertNodeParams{
			NodeID: ids.New("node"), PoolID: pool.PoolID, SiteID: pool.SiteID, Hostname: r.Hostname, State: StateReady,
			Labels: raw, CapVcpu: r.VCPU, CapMemoryMib: r.MemoryMiB, CapDiskGib: r.DiskGiB,
			GpuModel: pgtype.Text{String: r.GPUModel, Valid: r.GPUModel != ""}, CapGpus: r.GPUs, Declared: true,
		})
		if err != nil {
			return err
		}
		if err := proj.Put(ctx, tx, iam.Resource{
			Type: typePrefix + ResourceType, ID: n.NodeID, TenantID: pool.TenantID,
			Parent:     &iam.Ref{Type: typePrefix + "pool", ID: pool.PoolID},
			Attributes: map[string]string{"poolId": pool.PoolID, "siteId": pool.SiteID},
		}); err != nil {
			return err
		}
		out = Output(n, pool.TenantID)
		return outbox.Write(ctx, tx, outbox.Event{
			Type: api.EventNodeRegistered, Subject: n.NodeID, TenantID: pool.TenantID,
			Data: api.NodeRegisteredPayload{NodeID: n.NodeID, PoolID: n.PoolID, Hostname: n.Hostname, State: n.State},
		})
	})
	return out, err
}

// RunCommand runs `computed nodes ...` and returns the exit code.
func RunCommand(ctx context.Context, st *store.Store, proj iam.Projection, typePrefix string, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "register" {
		fmt.Fprintln(stderr, "usage: computed nodes register --pool <poolId> --hostname <name> --vcpu N --memory-mib N [--disk-gib N] [--gpu MODEL:COUNT] [--label k=v ...]")
		return 2
	}
	fs := flag.NewFlagSet("computed nodes register", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var r Registration
	var vcpu, gpu string
	labels := labelFlag{}
	fs.StringVar(&r.PoolID, "pool", "", "pool id")
	fs.StringVar(&r.Hostname, "hostname", "", "the host's name")
	fs.StringVar(&vcpu, "vcpu", "0", "vCPUs")
	fs.Int64Var(&r.MemoryMiB, "memory-mib", 0, "memory in MiB")
	fs.Int64Var(&r.DiskGiB, "disk-gib", 0, "disk in GiB")
	fs.StringVar(&gpu, "gpu", "", "GPUs as MODEL:COUNT")
	fs.Var(labels, "label", "a label k=v (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	n, err := strconv.ParseInt(vcpu, 10, 32)
	if err != nil {
		fmt.Fprintln(stderr, "computed nodes register: --vcpu: not an integer")
		return 2
	}
	r.VCPU = int32(n)
	if gpu != "" {
		model, count, ok := strings.Cut(gpu, ":")
		c, err := strconv.ParseInt(count, 10, 32)
		if !ok || err != nil || model == "" {
			fmt.Fprintln(stderr, "computed nodes register: --gpu: MODEL:COUNT")
			return 2
		}
		r.GPUModel, r.GPUs = model, int32(c)
	}
	r.Labels = labels
	node, err := Register(ctx, st, proj, typePrefix, r)
	if err != nil {
		fmt.Fprintln(stderr, "computed nodes register:", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(node)
	return 0
}

type labelFlag map[string]string

func (l labelFlag) String() string { return "" }

func (l labelFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return errors.New("want k=v")
	}
	l[k] = val
	return nil
}
