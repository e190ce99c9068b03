package tunnels

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/iam"
	"computeplane/internal/nodes"
	"computeplane/internal/outbox"
	"computeplane/internal/pki"
	"computeplane/internal/sandboxes"
	"computeplane/internal/sshca"
)

// SSH is the SSH side of tunnels (tunnels.ssh): certificates of the
// bundle's SSH CA for callers' keys, and what a tunnel of kind ssh hands
// the guest's server. Nil on a Service when tunnels.ssh is off.
type SSH struct {
	// Bundle opens the PKI bundle holding the CA.
	Bundle func() (*pki.Bundle, error)
	// RequiresMFA: break-glass (node) certificates need an MFA session.
	RequiresMFA bool
	// Accounts are the accounts of node certificates (tunnels.sshAccounts).
	Accounts []string
	// PerHour bounds certificates per identity on this replica.
	PerHour int
	Now     func() time.Time

	issued window // certificates of the last hour
}

func (s *SSH) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// ca is the bundle's SSH CA: UNAVAILABLE while the bundle cannot be read,
// INVALID_CONFIG when it has no SSH CA (written by an older release).
func (s *SSH) ca() (*sshca.CA, error) {
	b, err := s.Bundle()
	if err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "the PKI bundle cannot be read: %s", err.Error()).
			WithDetails(map[string]any{"retryAfterMs": 5000})
	}
	if b.SSHCA == nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "the PKI bundle has no SSH CA: run `computed pki init` once to add it, then restart the api")
	}
	return sshca.New(b.SSHCA, s.now)
}

// IssueSshCertificate answers tunnels.issueSshCertificate.
func (s *Service) IssueSshCertificate(ctx context.Context, in *api.TunnelsIssueSshCertificateInput) (*api.SshCertificate, error) {
	if err := s.absent(); err != nil {
		return nil, err
	}
	if s.SSH == nil {
		return nil, api.Errorf(api.CodeUnsupported, "SSH is not enabled on this deployment (tunnels.ssh)")
	}
	sess, tx, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	key, err := sshca.ParseUserKey(in.PublicKey)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidInput, "publicKey: %s", err.Error()).WithDetails(map[string]any{"path": "publicKey"})
	}
	var targetKind, targetID string
	var principals []string
	if in.NodeID != nil {
		// Break-glass: an account the deployment allows on nodes, from an
		// MFA session unless the deployment says otherwise.
		targetKind, targetID = "node", *in.NodeID
		if !slices.Contains(s.SSH.Accounts, in.Account) {
			return nil, api.Errorf(api.CodeInvalidInput, "account: %q is not one of the node accounts (tunnels.sshAccounts: %s)",
				in.Account, strings.Join(s.SSH.Accounts, ", ")).WithDetails(map[string]any{"path": "account"})
		}
		if s.SSH.RequiresMFA && !sess.Caller.MFA {
			return nil, api.Errorf(api.CodeAccessDenied, "a node's SSH certificate (break-glass) needs an MFA session (tunnels.sshRequiresMfa)").
				WithDetails(map[string]any{"reason": "mfa-required"})
		}
		n, err := q.GetNode(ctx, targetID)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && n.Node.State == nodes.StateRetired) {
			return nil, api.Errorf(api.CodeNotFound, "node %s not found", targetID)
		}
		if err != nil {
			return nil, err
		}
		principals = []string{sshca.Principal(in.Account, targetID)}
	} else {
		targetKind, targetID = in.Target.Kind, in.Target.ID
		if err := runningTarget(ctx, q, in.TenantID, *in.Target); err != nil {
			return nil, err
		}
		principals = []string{sshca.Principal(in.Account, targetID), sshca.Principal(in.Account, in.TenantID)}
	}
	ca, err := s.SSH.ca()
	if err != nil {
		return nil, err
	}
	if err := s.SSH.issued.allow(sess.Caller.IdentityID, s.SSH.now(), time.Hour, s.SSH.PerHour,
		fmt.Sprintf("at most %d SSH certificates per hour per identity", s.SSH.PerHour)); err != nil {
		return nil, err
	}
	keyID := fmt.Sprintf("tenant=%s identity=%s target=%s", in.TenantID, sess.Caller.IdentityID, targetID)
	cert, err := ca.SignUser(sshca.UserRequest{Key: key, Principals: principals, KeyID: keyID})
	if err != nil {
		return nil, err
	}
	out := &api.SshCertificate{Certificate: sshca.AuthorizedKey(cert), User: in.Account, Principals: principals, KeyID: keyID,
		Serial: strconv.FormatUint(cert.Serial, 10), ValidAfter: stamp(time.Unix(int64(cert.ValidAfter), 0)),
		ValidBefore: stamp(time.Unix(int64(cert.ValidBefore), 0)), CaPublicKey: ca.AuthorizedKey(), HostName: targetID,
		KnownHosts: sshca.KnownHostsLine(ca.PublicKey(), targetID)}
	return out, outbox.Write(ctx, tx, outbox.Event{Type: api.EventSecuritySshCertificateIssued, Subject: targetID, TenantID: in.TenantID,
		Data: api.SecuritySshCertificateIssuedPayload{IdentityID: sess.Caller.IdentityID, TargetKind: targetKind, TargetID: targetID,
			Principals: principals, KeyID: keyID, Serial: out.Serial, PublicKeyFingerprint: ssh.FingerprintSHA256(key), ValidBefore: out.ValidBefore}})
}

// runningTarget is NOT_FOUND for another tenant's or an absent target,
// INVALID_STATE for one not running.
func runningTarget(ctx context.Context, q *db.Queries, tenant string, t api.TunnelTarget) error {
	var err error
	switch t.Kind {
	case "sandbox":
		if !strings.HasPrefix(t.ID, "sbx_") {
			return api.Errorf(api.CodeInvalidInput, "target.id: a sandbox id (sbx_...)")
		}
		_, _, err = sandboxes.RunningVM(ctx, q, tenant, t.ID)
	default:
		if !strings.HasPrefix(t.ID, "inst_") {
			return api.Errorf(api.CodeInvalidInput, "target.id: an instance id (inst_...)")
		}
		_, _, err = runningInstance(ctx, q, tenant, t.ID)
	}
	return err
}

// sshOpen is what the daemon hands the guest's SSH server for one tunnel
// of kind ssh: the CA it trusts for users, the scope of the principals it
// accepts (<user>@<target id>), and a host key made for this tunnel with
// its certificate naming the target (computectl's known_hosts trusts the
// CA for that name). The key is made at redemption and never stored.
func (s *SSH) sshOpen(t db.Tunnel) (*tunnel.SSH, error) {
	if s == nil {
		return nil, api.Errorf(api.CodeUnsupported, "SSH is not enabled on this deployment (tunnels.ssh)")
	}
	ca, err := s.ca()
	if err != nil {
		return nil, err
	}
	host, err := ca.NewHostKey(t.TargetID)
	if err != nil {
		return nil, err
	}
	return &tunnel.SSH{UserCAs: []string{ca.AuthorizedKey()}, Scope: t.TargetID, HostKey: host.PrivateKeyPEM, HostCertificate: host.Certificate}, nil
}
