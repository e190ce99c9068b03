// Package tunnels is the tunnels group (docs/tunnels.md): tickets that
// tunnels.open issues, bound to the caller, the target, the kind and the
// caller's source address, and the api's relay that redeems one at
// GET {basePath}/tunnels/{ticket} and carries the tunnel to the gateway
// holding the target node's session (its internal API).
package tunnels

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/instances"
	"computeplane/internal/sandboxes"
)

// TicketTTL is how long a ticket waits for its redemption.
const TicketTTL = 30 * time.Second

// Service implements api.TunnelsService. Without an issuer (the tunnels
// option absent) the group does not exist: every method is NOT_FOUND.
type Service struct {
	// Issuer is the origin the ticket URLs name (tunnels.issuer);
	// BasePath the API's.
	Issuer, BasePath string
	// PerMinute bounds opens per identity on this replica.
	PerMinute int
	Now       func() time.Time
	// SSH is nil unless tunnels.ssh: certificates and tunnels of kind
	// ssh (ssh.go).
	SSH *SSH
	// PreviewKey signs preview tokens (PreviewKey of the secret);
	// PreviewDomain is tunnels.previewDomain ("" none).
	PreviewKey    []byte
	PreviewDomain string
	// NodeRequiresMFA: tunnels to a node (break-glass) need an MFA
	// session (tunnels.sshRequiresMfa, which rules node certificates too).
	NodeRequiresMFA bool

	opened window // opens of the last minute
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Service) absent() error {
	if s.Issuer == "" {
		return api.Errorf(api.CodeNotFound, "tunnels are not configured on this deployment (the tunnels option)")
	}
	return nil
}

// HashTicket is what a ticket is stored as.
func HashTicket(ticket string) []byte {
	h := sha256.Sum256([]byte(ticket))
	return h[:]
}

// Open answers tunnels.open.
func (s *Service) Open(ctx context.Context, in *api.TunnelsOpenInput) (*api.TunnelTicket, error) {
	if err := s.absent(); err != nil {
		return nil, err
	}
	sess, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkKind(in, s.SSH != nil); err != nil {
		return nil, err
	}
	var instance, node string
	switch in.Target.Kind {
	case "sandbox":
		if !strings.HasPrefix(in.Target.ID, "sbx_") {
			return nil, api.Errorf(api.CodeInvalidInput, "target.id: a sandbox id (sbx_...)")
		}
		instance, node, err = sandboxes.RunningVM(ctx, q, in.TenantID, in.Target.ID)
	default:
		if !strings.HasPrefix(in.Target.ID, "inst_") {
			return nil, api.Errorf(api.CodeInvalidInput, "target.id: an instance id (inst_...)")
		}
		instance, node, err = runningInstance(ctx, q, in.TenantID, in.Target.ID)
	}
	if err != nil {
		return nil, err
	}
	argv, _ := json.Marshal(in.Argv)
	if in.Argv == nil {
		argv = []byte("[]")
	}
	var env []byte
	if len(in.Env) > 0 {
		env, _ = json.Marshal(in.Env)
	}
	p := db.InsertTunnelParams{TenantID: in.TenantID, TargetKind: in.Target.Kind, TargetID: in.Target.ID, InstanceID: instance,
		NodeID: node, Kind: in.Kind, Argv: argv, Env: env, Tty: in.Tty}
	if in.Port != nil {
		p.Port = pgtype.Int4{Int32: int32(*in.Port), Valid: true}
	}
	return s.issue(ctx, sess, q, p, in.Size)
}

// issue counts an open against the caller's minute and writes its
// ticket's row.
func (s *Service) issue(ctx context.Context, sess *iam.Session, q *db.Queries, p db.InsertTunnelParams, size *api.TerminalSize) (*api.TunnelTicket, error) {
	if err := s.opened.allow(sess.Caller.IdentityID, s.now(), time.Minute, s.PerMinute,
		fmt.Sprintf("at most %d tunnels per minute per identity", s.PerMinute)); err != nil {
		return nil, err
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	ticket := base64.RawURLEncoding.EncodeToString(raw)
	p.TunnelID, p.IdentityID = ids.New("tun"), sess.Caller.IdentityID
	p.TicketHash, p.SourceIp, p.ExpiresAt = HashTicket(ticket), iam.SourceIPFromContext(ctx).String(), s.now().Add(TicketTTL)
	// The re-authorizer's (reauth.go): never answered.
	p.Session = sess.Caller.Session
	p.Caller, _ = json.Marshal(sess.Caller)
	if size != nil {
		p.TermCols = pgtype.Int4{Int32: int32(size.Cols), Valid: true}
		p.TermRows = pgtype.Int4{Int32: int32(size.Rows), Valid: true}
	}
	row, err := q.InsertTunnel(ctx, p)
	if err != nil {
		return nil, err
	}
	u := s.Issuer
	if rest, ok := strings.CutPrefix(u, "https://"); ok {
		u = "wss://" + rest
	} else {
		u = "ws://" + strings.TrimPrefix(u, "http://")
	}
	return &api.TunnelTicket{Tunnel: toAPI(row), Ticket: ticket, URL: strings.TrimSuffix(u, "/") + s.BasePath + "/tunnels/" + ticket}, nil
}

// checkKind checks that the input gives what its kind needs and nothing
// another kind's; ssh is UNSUPPORTED unless tunnels.ssh (sshOn).
func checkKind(in *api.TunnelsOpenInput, sshOn bool) error {
	exec := in.Kind == tunnel.KindExec
	switch {
	case in.Kind == tunnel.KindSSH && !sshOn:
		return api.Errorf(api.CodeUnsupported, "SSH is not enabled on this deployment (tunnels.ssh)")
	case exec && len(in.Argv) == 0:
		return api.Errorf(api.CodeInvalidInput, "argv: an exec tunnel runs a program").WithDetails(map[string]any{"field": "argv"})
	case !exec && len(in.Argv) > 0:
		return api.Errorf(api.CodeInvalidInput, "argv: only an exec tunnel runs a program").WithDetails(map[string]any{"field": "argv"})
	case !exec && (len(in.Env) > 0 || in.Tty || in.Size != nil):
		return api.Errorf(api.CodeInvalidInput, "env, tty and size are an exec tunnel's")
	case in.Size != nil && !in.Tty:
		return api.Errorf(api.CodeInvalidInput, "size: a terminal's size needs tty").WithDetails(map[string]any{"field": "size"})
	case in.Kind == tunnel.KindTCP && in.Port == nil:
		return api.Errorf(api.CodeInvalidInput, "port: a tcp tunnel connects to a guest port").WithDetails(map[string]any{"field": "port"})
	case in.Kind != tunnel.KindTCP && in.Port != nil:
		return api.Errorf(api.CodeInvalidInput, "port: only a tcp tunnel connects to a port").WithDetails(map[string]any{"field": "port"})
	}
	return nil
}

func runningInstance(ctx context.Context, q *db.Queries, tenant, id string) (string, string, error) {
	vm, err := q.GetInstance(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && vm.TenantID != tenant) {
		return "", "", api.Errorf(api.CodeNotFound, "instance %s not found", id)
	}
	if err != nil {
		return "", "", err
	}
	if vm.State != instances.StateRunning || !vm.NodeID.Valid {
		return "", "", api.Errorf(api.CodeInvalidState, "instance %s is %s; only a running one opens tunnels", id, vm.State).
			WithDetails(map[string]any{"state": vm.State})
	}
	return vm.InstanceID, vm.NodeID.String, nil
}

// List answers tunnels.list.
func (s *Service) List(ctx context.Context, in *api.TunnelsListInput) (*api.TunnelList, error) {
	if err := s.absent(); err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.ListTunnels(ctx, db.ListTunnelsParams{TenantID: in.TenantID, IncludeClosed: in.IncludeClosed})
	if err != nil {
		return nil, err
	}
	out := &api.TunnelList{Items: make([]api.Tunnel, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, toAPI(r))
	}
	return out, nil
}

// Close answers tunnels.close: a ticket is void at once; an open tunnel's
// relay sees the row closed within a second and writes tunnel.closed.
func (s *Service) Close(ctx context.Context, in *api.TunnelsCloseInput) (*api.Tunnel, error) {
	if err := s.absent(); err != nil {
		return nil, err
	}
	_, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	cur, err := q.GetTunnelForUpdate(ctx, in.TunnelID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && cur.TenantID != in.TenantID) {
		return nil, api.Errorf(api.CodeNotFound, "tunnel %s not found", in.TunnelID)
	}
	if err != nil {
		return nil, err
	}
	if cur.State != "issued" && cur.State != "open" {
		t := toAPI(cur)
		return &t, nil
	}
	row, err := q.CloseTunnel(ctx, in.TunnelID)
	if err != nil {
		return nil, err
	}
	if cur.State == "issued" {
		if err := closedEvent(ctx, tx, row, "closed"); err != nil {
			return nil, err
		}
	}
	t := toAPI(row)
	return &t, nil
}

func toAPI(r db.Tunnel) api.Tunnel {
	t := api.Tunnel{TunnelID: r.TunnelID, TenantID: r.TenantID, IdentityID: r.IdentityID,
		Target: api.TunnelEnd{Kind: r.TargetKind, ID: r.TargetID}, Kind: r.Kind, Tty: r.Tty, State: r.State,
		CreatedAt: stamp(r.CreatedAt), ExpiresAt: stamp(r.ExpiresAt), BytesIn: r.BytesIn, BytesOut: r.BytesOut}
	_ = json.Unmarshal(r.Argv, &t.Argv)
	if t.Argv == nil {
		t.Argv = []string{}
	}
	if r.Port.Valid {
		v := int64(r.Port.Int32)
		t.Port = &v
	}
	if r.OpenedAt != nil {
		v := stamp(*r.OpenedAt)
		t.OpenedAt = &v
	}
	if r.ClosedAt != nil {
		v := stamp(*r.ClosedAt)
		t.ClosedAt = &v
	}
	t.ExitCode = exitCode(r.ExitCode)
	return t
}

func exitCode(c pgtype.Int4) *int64 {
	if !c.Valid {
		return nil
	}
	v := int64(c.Int32)
	return &v
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
