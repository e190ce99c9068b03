// Package join lets a machine become a node of a pool: an operator (or a
// provider bootstrap) mints a single-use join token for the pool; the
// machine presents it with a certificate request and receives a node
// certificate from the node CA.
//
// A token is sealed to the join service's key (ECDH P-256, HKDF-SHA256,
// AES-256-GCM) and carries only its id and expiry: the token itself is never
// stored or logged, and only the join service can read one. At first use
// it is bound to the public key of the request: presenting it again with
// the same key (a retry after a lost answer) gets the same node, with any
// other key it is refused as reused.
package join

import (
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/nodes"
	"computeplane/internal/pki"
)

// TokenPrefix starts every join token.
const TokenPrefix = "cjt_"

// DefaultTTL is how long a token can be used, like Teleport's ephemeral
// tokens.
const DefaultTTL = 30 * time.Minute

// Refusals of Redeem.
var (
	ErrInvalid = errors.New("join: not a join token of this deployment")
	ErrExpired = errors.New("join: the token has expired")
	ErrReused  = errors.New("join: the token was used by another key")
	ErrRevoked = errors.New("join: the token was revoked")
)

type claims struct {
	ID  string `json:"id"`
	Exp int64  `json:"exp"` // unix seconds
	// Machine binds a token minted for one provider machine (a
	// bootstrap): only a request naming that machine redeems it.
	Machine string `json:"machine,omitempty"`
}

const info = "computeplane join token v1"

func aeadFor(shared, salt []byte) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, shared, salt, info, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// seal encrypts c to the join key.
func seal(b *pki.Bundle, c claims) (string, error) {
	to, err := b.Join.PublicKey.ECDH()
	if err != nil {
		return "", err
	}
	eph, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	shared, err := eph.ECDH(to)
	if err != nil {
		return "", err
	}
	pub := eph.PublicKey().Bytes()
	aead, err := aeadFor(shared, pub)
	if err != nil {
		return "", err
	}
	plain, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := append(append(append([]byte{}, pub...), nonce...), aead.Seal(nil, nonce, plain, pub)...)
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(out), nil
}

// open reads a token sealed to the bundle's join key.
func open(b *pki.Bundle, token string) (claims, error) {
	raw, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok {
		return claims{}, ErrInvalid
	}
	buf, err := base64.RawURLEncoding.Strict().DecodeString(raw)
	const pubLen, nonceLen = 65, 12
	if err != nil || len(buf) < pubLen+nonceLen+16 {
		return claims{}, ErrInvalid
	}
	pub, nonce, ct := buf[:pubLen], buf[pubLen:pubLen+nonceLen], buf[pubLen+nonceLen:]
	eph, err := ecdh.P256().NewPublicKey(pub)
	if err != nil {
		return claims{}, ErrInvalid
	}
	priv, err := b.Join.ECDH()
	if err != nil {
		return claims{}, err
	}
	shared, err := priv.ECDH(eph)
	if err != nil {
		return claims{}, ErrInvalid
	}
	aead, err := aeadFor(shared, pub)
	if err != nil {
		return claims{}, err
	}
	plain, err := aead.Open(nil, nonce, ct, pub)
	if err != nil {
		return claims{}, ErrInvalid // another deployment's, or changed
	}
	var c claims
	if err := json.Unmarshal(plain, &c); err != nil || c.ID == "" {
		return claims{}, ErrInvalid
	}
	return c, nil
}

// Mint makes a token for pool (of tenant, in site), valid for ttl
// (DefaultTTL when 0), in tx. Only its id and state are stored.
func Mint(ctx context.Context, tx pgx.Tx, b *pki.Bundle, tenant, pool, site, createdBy string, ttl time.Duration, now time.Time) (token, id string, err error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	id = ids.New("jtk")
	exp := now.Add(ttl)
	if err := db.New(tx).InsertJoinToken(ctx, db.InsertJoinTokenParams{
		TokenID: id, TenantID: tenant, PoolID: pool, SiteID: site, CreatedBy: createdBy, ExpiresAt: exp,
	}); err != nil {
		return "", "", err
	}
	token, err = seal(b, claims{ID: id, Exp: exp.Unix()})
	return token, id, err
}

// MintFor is Mint for one machine of a provider (a bootstrap): the token
// is bound to the machine, so only a certificate request whose common
// name is that machine redeems it.
func MintFor(ctx context.Context, tx pgx.Tx, b *pki.Bundle, tenant, pool, site, createdBy, machine string, ttl time.Duration, now time.Time) (token, id string, err error) {
	if machine == "" {
		return "", "", errors.New("join: a machine to bind the token to")
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	id = ids.New("jtk")
	exp := now.Add(ttl)
	if err := db.New(tx).InsertJoinToken(ctx, db.InsertJoinTokenParams{
		TokenID: id, TenantID: tenant, PoolID: pool, SiteID: site, CreatedBy: createdBy, ExpiresAt: exp,
	}); err != nil {
		return "", "", err
	}
	token, err = seal(b, claims{ID: id, Exp: exp.Unix(), Machine: machine})
	return token, id, err
}

// Grant is what a redeemed token gives the machine.
type Grant struct {
	NodeID string
	PoolID string
	Cert   *x509.Certificate
}

// keyID names a request's public key: the SHA-256 of its DER.
func keyID(csr *x509.CertificateRequest) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(csr.PublicKey)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// Redeem checks a token and a certificate request and, in tx, makes the
// node (joining) on first use and issues its certificate. A retry with the
// same key gets the same node and a new certificate.
func Redeem(ctx context.Context, tx pgx.Tx, b *pki.Bundle, proj iam.Projection, typePrefix, token string, csr *x509.CertificateRequest, now time.Time) (*Grant, error) {
	c, err := open(b, token)
	if err != nil {
		return nil, err
	}
	if now.Unix() >= c.Exp {
		return nil, ErrExpired
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("join: the certificate request's signature: %w", err)
	}
	if c.Machine != "" && csr.Subject.CommonName != c.Machine {
		return nil, fmt.Errorf("%w (it is bound to another machine)", ErrInvalid)
	}
	key, err := keyID(csr)
	if err != nil {
		return nil, err
	}
	q := db.New(tx)
	row, err := q.GetJoinTokenForUpdate(ctx, c.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrInvalid
	}
	if err != nil {
		return nil, err
	}
	switch {
	case row.Revoked:
		return nil, ErrRevoked
	case row.UsedAt != nil && row.BoundKey.String != key:
		return nil, ErrReused
	case row.UsedAt != nil:
		cert, err := b.IssueNode(csr, row.NodeID.String)
		return &Grant{NodeID: row.NodeID.String, PoolID: row.PoolID, Cert: cert}, err
	}
	n, err := q.InsertNode(ctx, db.InsertNodeParams{
		NodeID: ids.New("node"), PoolID: row.PoolID, SiteID: row.SiteID, Hostname: cmp.Or(csr.Subject.CommonName, "unnamed"),
		State: nodes.StateJoining, Labels: []byte("{}"),
	})
	if err != nil {
		return nil, err
	}
	if err := proj.Put(ctx, tx, iam.Resource{
		Type: typePrefix + nodes.ResourceType, ID: n.NodeID, TenantID: row.TenantID,
		Parent:     &iam.Ref{Type: typePrefix + "pool", ID: row.PoolID},
		Attributes: map[string]string{"poolId": row.PoolID, "siteId": row.SiteID},
	}); err != nil {
		return nil, err
	}
	if err := q.UseJoinToken(ctx, db.UseJoinTokenParams{TokenID: row.TokenID, BoundKey: pgtype.Text{String: key, Valid: true},
		NodeID: pgtype.Text{String: n.NodeID, Valid: true}}); err != nil {
		return nil, err
	}
	cert, err := b.IssueNode(csr, n.NodeID)
	if err != nil {
		return nil, err
	}
	return &Grant{NodeID: n.NodeID, PoolID: row.PoolID, Cert: cert}, nil
}

// RevokeSite revokes every token of a site (sites.delete), in tx.
func RevokeSite(ctx context.Context, tx pgx.Tx, site string) (int64, error) {
	return db.New(tx).RevokeSiteJoinTokens(ctx, site)
}
