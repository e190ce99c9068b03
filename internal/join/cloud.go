package join

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/providers/instanceid"
)

// The cloud instance-identity attestor (attestors: [cloud]) admits a
// provider machine only with its provider's signed identity document
// (internal/providers/instanceid), besides the join token bound to the
// machine. At join:
//
//  1. Outside any transaction, the document is verified: a JWT of a
//     configured issuer, signed by a key of the issuer's JWKS (fetched
//     with a timeout and cached; an unknown key id fetches again), naming
//     the attestor's audience (the join endpoint), issued at most maxAge
//     ago (and not in the future beyond a minute's skew), not expired,
//     naming an instance, an account and a region.
//  2. In the join's transaction, before the token is redeemed: the
//     token must be one a provider bootstrap minted (bound to a machine);
//     the document's instance must be the bootstrap's machine and the
//     token's binding, its account the bootstrap's provider account, and
//     its issuer one of that account's provider; and the document must
//     not have joined before (cloud_identity_documents). Only then is the
//     node made, with its node_attestations row, in the same transaction:
//     a refused document leaves no node behind.
//
// A join whose token is not bound to a provider machine (a machine an
// operator installed by hand) joins with the token alone.

// Audience is the audience of a document for the join endpoint of the
// public host at base (what compute-agent join --api names): base +
// /v1/join.
func Audience(base string) string { return agentproto.JoinAudience(base) }

// CloudSkew is how far in the future a document's iat may be.
const CloudSkew = time.Minute

// JWKSTimeout bounds one fetch of an issuer's keys.
const JWKSTimeout = 5 * time.Second

// jwksRefresh is how long fetched keys are used before they are fetched
// again; jwksMinGap spaces fetches caused by unknown key ids.
const (
	jwksRefresh = 10 * time.Minute
	jwksMinGap  = 10 * time.Second
)

// CloudIssuer is a metadata service the attestor trusts.
type CloudIssuer struct {
	Issuer, JWKSURL, Provider string
}

// CloudAttestor verifies instance-identity documents.
type CloudAttestor struct {
	Audience string
	MaxAge   time.Duration
	HTTP     *http.Client
	issuers  map[string]*issuerKeys
}

type issuerKeys struct {
	CloudIssuer
	mu        sync.Mutex
	keys      *jose.JSONWebKeySet
	fetchedAt time.Time
}

// NewCloudAttestor trusts the issuers' documents for audience.
func NewCloudAttestor(audience string, maxAge time.Duration, issuers []CloudIssuer) *CloudAttestor {
	a := &CloudAttestor{Audience: audience, MaxAge: maxAge, HTTP: &http.Client{Timeout: JWKSTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, issuers: map[string]*issuerKeys{}}
	for _, is := range issuers {
		a.issuers[is.Issuer] = &issuerKeys{CloudIssuer: is}
	}
	return a
}

// CloudIdentity is what a verified document says.
type CloudIdentity struct {
	Issuer, Provider, InstanceID, AccountID, Region string
	Digest                                          string // SHA-256 hex of the document
}

// Verify checks a document's signature and claims (step 1).
func (a *CloudAttestor) Verify(ctx context.Context, doc string, now time.Time) (*CloudIdentity, error) {
	if doc == "" {
		return nil, fmt.Errorf("%w: an instance-identity document is required (attestors names cloud)", ErrAttestation)
	}
	if len(doc) > instanceid.MaxDocumentBytes {
		return nil, fmt.Errorf("%w: the identity document is over %d bytes", ErrAttestation, instanceid.MaxDocumentBytes)
	}
	tok, err := jwt.ParseSigned(doc, instanceid.Algorithms)
	if err != nil {
		return nil, fmt.Errorf("%w: the identity document is not a signed JWT: %v", ErrAttestation, err)
	}
	var unverified instanceid.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return nil, fmt.Errorf("%w: the identity document's claims: %v", ErrAttestation, err)
	}
	is := a.issuers[unverified.Issuer]
	if is == nil {
		return nil, fmt.Errorf("%w: the identity document's issuer %q is not trusted (cloud.issuers)", ErrAttestation, unverified.Issuer)
	}
	kid := tok.Headers[0].KeyID
	keys, err := is.get(ctx, a.HTTP, kid, now)
	if err != nil {
		return nil, err
	}
	var c instanceid.Claims
	verified := false
	for _, k := range keys {
		if err := tok.Claims(k.Key, &c); err == nil {
			verified = true
			break
		}
	}
	if !verified {
		return nil, fmt.Errorf("%w: the identity document's signature does not verify with a key of %s", ErrAttestation, is.Issuer)
	}
	switch {
	case !c.Audience.Contains(a.Audience):
		return nil, fmt.Errorf("%w: the identity document is for audience %v, not this join endpoint (%s)", ErrAttestation, []string(c.Audience), a.Audience)
	case c.IssuedAt == nil:
		return nil, fmt.Errorf("%w: the identity document has no iat", ErrAttestation)
	case c.IssuedAt.Time().After(now.Add(CloudSkew)):
		return nil, fmt.Errorf("%w: the identity document was issued in the future (%s)", ErrAttestation, c.IssuedAt.Time().UTC().Format(time.RFC3339))
	case now.Sub(c.IssuedAt.Time()) > a.MaxAge:
		return nil, fmt.Errorf("%w: the identity document is older than %s (cloud.maxAge): issued %s", ErrAttestation, a.MaxAge, c.IssuedAt.Time().UTC().Format(time.RFC3339))
	case c.Expiry != nil && !now.Before(c.Expiry.Time()):
		return nil, fmt.Errorf("%w: the identity document expired at %s", ErrAttestation, c.Expiry.Time().UTC().Format(time.RFC3339))
	case c.NotBefore != nil && now.Add(CloudSkew).Before(c.NotBefore.Time()):
		return nil, fmt.Errorf("%w: the identity document is not valid yet", ErrAttestation)
	case c.InstanceID == "" || c.AccountID == "" || c.Region == "":
		return nil, fmt.Errorf("%w: the identity document must name instance_id, account_id and region", ErrAttestation)
	case c.Subject != "" && c.Subject != c.InstanceID:
		return nil, fmt.Errorf("%w: the identity document's sub is not its instance_id", ErrAttestation)
	}
	return &CloudIdentity{Issuer: is.Issuer, Provider: is.Provider, InstanceID: c.InstanceID, AccountID: c.AccountID, Region: c.Region,
		Digest: instanceid.Digest(doc)}, nil
}

// get answers the issuer's keys for kid: the cached set, fetched again
// when it is old or lacks kid (at most every jwksMinGap). An unreachable
// JWKS is UNAVAILABLE.
func (is *issuerKeys) get(ctx context.Context, hc *http.Client, kid string, now time.Time) ([]jose.JSONWebKey, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	stale := is.keys == nil || now.Sub(is.fetchedAt) > jwksRefresh ||
		(kid != "" && len(is.keys.Key(kid)) == 0 && now.Sub(is.fetchedAt) > jwksMinGap)
	if stale {
		keys, err := fetchJWKS(ctx, hc, is.JWKSURL)
		if err != nil {
			if is.keys == nil || kid != "" && len(is.keys.Key(kid)) == 0 {
				return nil, api.Errorf(api.CodeUnavailable, "the keys of issuer %s could not be fetched: %v", is.Issuer, err).
					WithDetails(map[string]any{"retryAfterMs": 2000})
			}
		} else {
			is.keys, is.fetchedAt = keys, now
		}
	}
	if kid != "" {
		return is.keys.Key(kid), nil
	}
	return is.keys.Keys, nil
}

func fetchJWKS(ctx context.Context, hc *http.Client, url string) (*jose.JSONWebKeySet, error) {
	ctx, cancel := context.WithTimeout(ctx, JWKSTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", url, res.Status)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(res.Body, 256<<10)).Decode(&set); err != nil {
		return nil, fmt.Errorf("%s: not a JWKS: %v", url, err)
	}
	return &set, nil
}

// Bind matches a verified identity to the provider bootstrap that minted
// the token and consumes the document, in the join's transaction
// (step 2). machine is the token's binding ("" for a token not minted for
// a provider machine).
func (a *CloudAttestor) Bind(ctx context.Context, tx pgx.Tx, tokenID, machine string, id *CloudIdentity) error {
	q := db.New(tx)
	bs, err := q.GetBootstrapOfToken(ctx, pgtype.Text{String: tokenID, Valid: true})
	if errors.Is(err, pgx.ErrNoRows) || machine == "" {
		return fmt.Errorf("%w: the join token was not minted for a provider machine", ErrAttestation)
	}
	if err != nil {
		return err
	}
	switch {
	case id.InstanceID != machine || id.InstanceID != bs.MachineID.String:
		return fmt.Errorf("%w: the identity document names instance %s, not the machine this token was minted for", ErrAttestation, id.InstanceID)
	case id.AccountID != bs.AccountID:
		return fmt.Errorf("%w: the identity document names account %s, not the machine's provider account", ErrAttestation, id.AccountID)
	case id.Provider != bs.Provider:
		return fmt.Errorf("%w: issuer %s vouches for provider %s, not %s", ErrAttestation, id.Issuer, id.Provider, bs.Provider)
	}
	n, err := q.ConsumeCloudIdentityDocument(ctx, db.ConsumeCloudIdentityDocumentParams{DocumentSha256: id.Digest, InstanceID: id.InstanceID, TokenID: tokenID})
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: the identity document was already used to join (a replay)", ErrAttestation)
	}
	return nil
}
