package pki

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"slices"
)

// RootsDigest names a set of roots: a SHA-256 over the SHA-256 of each
// root's DER, sorted and without repeats, so that the same certificates
// in any order (or listed twice, as a CertPool keeps them once) name the
// same set.
func RootsDigest(roots []*x509.Certificate) [32]byte {
	sums := make([][32]byte, 0, len(roots))
	for _, c := range roots {
		sums = append(sums, sha256.Sum256(c.Raw))
	}
	slices.SortFunc(sums, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
	sums = slices.Compact(sums)
	h := sha256.New()
	for _, s := range sums {
		h.Write(s[:])
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// SessionTicketKey is the TLS session ticket key gateways use for period
// (a count of ticket key periods since the Unix epoch, chosen by the
// gateway) while they verify client certificates against the roots
// rootsDigest names (RootsDigest): every gateway of the deployment with
// the same bundle and the same roots derives the same key, so a daemon
// resumes its TLS session on a restarted gateway or on another one.
//
// It is derived (HKDF-SHA256) from the node CA's private key because a
// ticket key is worth as much as that key: a resumed session carries the
// client certificate inside the ticket, so whoever can seal tickets can
// claim any node's certificate, which is what the node CA key allows
// anyway. Nothing new has to be kept, shared or rotated by hand; rotating
// the node CA (a new bundle) changes every ticket key.
//
// It is bound to the roots because a gateway seals a ticket only for a
// chain that verified against its roots, and a gateway holding a key
// bound to the same roots resumes the ticket without verifying the chain
// again: a ticket sealed under other roots must not open.
func (b *Bundle) SessionTicketKey(period int64, rootsDigest [32]byte) ([32]byte, error) {
	var out [32]byte
	if b.NodeCA.Key == nil {
		return out, errors.New("pki: the bundle has no node CA key")
	}
	der, err := x509.MarshalPKCS8PrivateKey(b.NodeCA.Key)
	if err != nil {
		return out, err
	}
	info := binary.BigEndian.AppendUint64([]byte("computeplane gateway session ticket key "), uint64(period))
	info = append(info, rootsDigest[:]...)
	k, err := hkdf.Key(sha256.New, der, []byte(b.TrustDomain), string(info), len(out))
	if err != nil {
		return out, err
	}
	copy(out[:], k)
	return out, nil
}
