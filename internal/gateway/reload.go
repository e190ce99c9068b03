package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"computeplane/internal/config"
)

// ReloadEvery is how often certificates and roots given as files are read
// again (Limits: certificate reload); new handshakes use what was read.
const ReloadEvery = 60 * time.Second

// reloading keeps a value read from files, reading again once it is
// ReloadEvery old. A read that fails keeps the last good value (and is
// logged): a half-written file never takes a gateway down.
type reloading[T any] struct {
	read func() (T, error)
	now  func() time.Time
	log  *slog.Logger
	what string

	mu     sync.Mutex
	val    T
	readAt time.Time
}

func newReloading[T any](what string, read func() (T, error), now func() time.Time, log *slog.Logger) (*reloading[T], error) {
	r := &reloading[T]{read: read, now: now, log: log, what: what}
	v, err := read()
	if err != nil {
		return nil, err
	}
	r.val, r.readAt = v, now()
	return r, nil
}

func (r *reloading[T]) get() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.now().Sub(r.readAt) < ReloadEvery {
		return r.val
	}
	r.readAt = r.now()
	v, err := r.read()
	if err != nil {
		r.log.Warn("gateway: reloading kept the last good value", "what", r.what, "error", err.Error())
		return r.val
	}
	r.val = v
	return v
}

// readPEM returns a PEM's text, inline or from its file.
func readPEM(p config.PEM) ([]byte, error) {
	if p.File != "" {
		return os.ReadFile(p.File)
	}
	return []byte(p.Inline), nil
}

// keyPairReader reads a configured certificate and key.
func keyPairReader(kp *config.KeyPair) func() (*tls.Certificate, error) {
	return func() (*tls.Certificate, error) {
		c, err := readPEM(kp.Cert)
		if err != nil {
			return nil, err
		}
		k, err := readPEM(kp.Key)
		if err != nil {
			return nil, err
		}
		pair, err := tls.X509KeyPair(c, k)
		return &pair, err
	}
}

// rootsReader reads the certificates of a configured PEM as a root set.
func rootsReader(p config.PEM) func() (*rootSet, error) {
	return func() (*rootSet, error) {
		data, err := readPEM(p)
		if err != nil {
			return nil, err
		}
		var certs []*x509.Certificate
		for blk, rest := pem.Decode(data); blk != nil; blk, rest = pem.Decode(rest) {
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, err
			}
			certs = append(certs, c)
		}
		if len(certs) == 0 {
			return nil, errors.New("no certificate in the node CA roots")
		}
		return newRootSet(certs), nil
	}
}
