package pki

import (
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
)

// SessionTicketKey is the TLS session ticket key gateways use for period
// (a count of ticket key periods since the Unix epoch, chosen by the
// gateway): every gateway of the deployment derives the same key from the
// same bundle, so a daemon resumes its TLS session on a restarted gateway
// or on another one.
//
// It is derived (HKDF-SHA256) from the node CA's private key because a
// ticket key is worth as much as that key: a resumed session carries the
// client certificate inside the ticket, so whoever can seal tickets can
// claim any node's certificate, which is what the node CA key allows
// anyway. Nothing new has to be kept, shared or rotated by hand; rotating
// the node CA (a new bundle) changes every ticket key.
func (b *Bundle) SessionTicketKey(period int64) ([32]byte, error) {
	var out [32]byte
	if b.NodeCA.Key == nil {
		return out, errors.New("pki: the bundle has no node CA key")
	}
	der, err := x509.MarshalPKCS8PrivateKey(b.NodeCA.Key)
	if err != nil {
		return out, err
	}
	info := binary.BigEndian.AppendUint64([]byte("computeplane gateway session ticket key "), uint64(period))
	k, err := hkdf.Key(sha256.New, der, []byte(b.TrustDomain), string(info), len(out))
	if err != nil {
		return out, err
	}
	copy(out[:], k)
	return out, nil
}
