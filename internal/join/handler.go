package join

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/iam"
	"computeplane/internal/pki"
	"computeplane/internal/rpc"
	"computeplane/internal/store"
)

// MaxRequestBytes bounds a join request.
const MaxRequestBytes = 64 << 10

// Gateways lists the live gateways of a region for a joined daemon.
type Gateways func(ctx context.Context, q *db.Queries, region string) ([]agentproto.Gateway, error)

// Handler serves POST agentproto.JoinPath on the public host: a machine
// presents a join token and a certificate request and receives its node
// certificate, the roots, the command signing keys and its region's
// gateways. It needs no API credential: the token is the credential.
type Handler struct {
	Store      *store.Store
	Bundle     func() (*pki.Bundle, error)
	Projection iam.Projection
	TypePrefix string
	Gateways   Gateways
	// FallbackURL is the wss:// URL of the public host's session endpoint.
	FallbackURL string
	Log         *slog.Logger
	Now         func() time.Time
	// TPM, when set, is the TPM attestor: every join must carry a quote
	// from an enrolled TPM (and JoinTPMChallengePath is served).
	TPM *TPMAttestor
	// Cloud, when set, is the cloud instance-identity attestor: a join
	// with a token minted for a provider machine must carry the
	// provider's signed identity document of that machine.
	Cloud *CloudAttestor
}

// Timeout bounds one join.
const Timeout = 10 * time.Second

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		rpc.WriteError(w, h.Log, api.Errorf(api.CodeMethodNotAllowed, "only POST is allowed here"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), Timeout)
	defer cancel()
	var (
		out any
		err error
	)
	switch r.URL.Path {
	case agentproto.JoinTPMChallengePath:
		out, err = h.tpmChallenge(ctx, r)
	default:
		out, err = h.join(ctx, r)
	}
	if err != nil {
		rpc.WriteError(w, h.Log, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}

// decode reads a bounded JSON body into v, refusing unknown fields.
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxRequestBytes+1))
	if err != nil {
		return api.Errorf(api.CodeInvalidInput, "reading the request: %v", err)
	}
	if len(body) > MaxRequestBytes {
		return api.Errorf(api.CodeInvalidInput, "a join request is at most %d bytes", MaxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return api.Errorf(api.CodeInvalidInput, "the body is not a join request: %v", err)
	}
	return nil
}

// refusal turns a refused token or attestation into UNAUTHENTICATED.
func (h *Handler) refusal(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrExpired), errors.Is(err, ErrReused), errors.Is(err, ErrRevoked), errors.Is(err, ErrAttestation):
		h.Log.InfoContext(ctx, "join refused", "reason", err.Error())
		return api.Errorf(api.CodeUnauthenticated, "%s", err.Error())
	}
	return err
}

// tpmChallenge answers the TPM attestor's credential for a node's TPM.
func (h *Handler) tpmChallenge(_ context.Context, r *http.Request) (*agentproto.TPMChallenge, error) {
	if h.TPM == nil {
		return nil, api.Errorf(api.CodeNotFound, "this deployment does not run the TPM attestor (attestors)")
	}
	var req agentproto.TPMChallengeRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	b, err := h.Bundle()
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "this deployment has no PKI bundle: %v", err)
	}
	ch, err := h.TPM.Challenge(b, req, h.Now())
	if err != nil {
		return nil, h.refusal(r.Context(), err)
	}
	return ch, nil
}

func (h *Handler) join(ctx context.Context, r *http.Request) (*agentproto.JoinResponse, error) {
	var req agentproto.JoinRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if req.Token == "" {
		return nil, api.Errorf(api.CodeInvalidInput, "token is required")
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidInput, "csr is not a DER certificate request: %v", err)
	}
	b, err := h.Bundle()
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidConfig, "this deployment has no PKI bundle: %v", err)
	}
	// The attestation is checked before anything is written: a refused
	// one leaves no node behind.
	var att *Attestation
	if h.TPM != nil {
		if att, err = h.TPM.Verify(b, req.Token, csr, req.TPM, h.Now()); err != nil {
			return nil, h.refusal(ctx, err)
		}
	} else if req.TPM != nil {
		return nil, api.Errorf(api.CodeInvalidInput, "this deployment does not run the TPM attestor; join with the token alone")
	}
	var (
		cloud *CloudIdentity
		tc    claims
	)
	if h.Cloud != nil {
		if tc, err = open(b, req.Token); err != nil {
			return nil, h.refusal(ctx, err)
		}
		if tc.Machine != "" || req.CloudIdentity != "" {
			if cloud, err = h.Cloud.Verify(ctx, req.CloudIdentity, h.Now()); err != nil {
				return nil, h.refusal(ctx, err)
			}
		}
	} else if req.CloudIdentity != "" {
		return nil, api.Errorf(api.CodeInvalidInput, "this deployment does not run the cloud attestor; join with the token alone")
	}
	var (
		grant  *Grant
		region string
		gws    []agentproto.Gateway
	)
	err = h.Store.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		// The document is matched and consumed before the token is
		// redeemed: a replayed document is refused as such.
		if cloud != nil {
			if err := h.Cloud.Bind(ctx, tx, tc.ID, tc.Machine, cloud); err != nil {
				return err
			}
		}
		grant, err = Redeem(ctx, tx, b, h.Projection, h.TypePrefix, req.Token, csr, h.Now())
		if err != nil {
			return err
		}
		q := db.New(tx)
		switch {
		case att != nil: // with both attestors, the row keeps the TPM's proof
			if err := q.PutNodeAttestation(ctx, db.PutNodeAttestationParams{NodeID: grant.NodeID,
				EndorsementKeySha256: att.EndorsementKey, AttestationKeySha256: att.AttestationKey, NodeKeySha256: att.NodeKey}); err != nil {
				return err
			}
		case cloud != nil:
			if err := q.PutCloudAttestation(ctx, db.PutCloudAttestationParams{NodeID: grant.NodeID, InstanceID: cloud.InstanceID,
				AccountID: cloud.AccountID, DocumentSha256: cloud.Digest}); err != nil {
				return err
			}
		}
		n, err := q.GetNode(ctx, grant.NodeID)
		if err != nil {
			return err
		}
		site, err := q.GetSite(ctx, n.Node.SiteID)
		if err != nil {
			return err
		}
		region = site.Region
		gws, err = h.Gateways(ctx, q, region)
		return err
	})
	if err != nil {
		return nil, h.refusal(ctx, err)
	}
	h.Log.InfoContext(ctx, "node joined", "node", grant.NodeID, "pool", grant.PoolID, "region", region, "attested", att != nil, "instance", cloudInstance(cloud))
	resp := &agentproto.JoinResponse{
		NodeID: grant.NodeID, PoolID: grant.PoolID, TrustDomain: b.TrustDomain,
		Certificate: grant.Cert.Raw, NodeCA: b.NodeCA.Cert.Raw, ServingCA: b.ServingCA.Cert.Raw,
		CommandSigningKeys: [][]byte{b.CommandKey()}, Gateways: gws, FallbackURL: h.FallbackURL,
	}
	if k := b.ReleaseKey(); k != nil {
		resp.ReleaseKeys = [][]byte{k}
	}
	return resp, nil
}

func cloudInstance(c *CloudIdentity) string {
	if c == nil {
		return ""
	}
	return c.InstanceID
}
