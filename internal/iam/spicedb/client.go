package spicedb

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	authzed "github.com/authzed/authzed-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"computeplane/internal/config"
	"computeplane/internal/iam"
)

// Dial opens the (lazy) gRPC client of cfg: TLS unless plaintext, which
// the configuration allows only to a loopback host, and the preshared key
// as a bearer token on every call.
func Dial(cfg *config.SpiceDB) (*authzed.Client, error) {
	transport := insecure.NewCredentials()
	if !cfg.Plaintext {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("spicedb: caFile: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, errors.New("spicedb: caFile holds no PEM certificate")
			}
		}
		transport = credentials.NewTLS(tc)
	}
	return authzed.NewClient(cfg.Endpoint,
		grpc.WithTransportCredentials(transport),
		grpc.WithPerRPCCredentials(bearer{token: cfg.PresharedKey, secure: !cfg.Plaintext}))
}

// bearer sends the preshared key.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// unavailable marks a failed SpiceDB call: the gate answers UNAVAILABLE
// with retryAfterMs, and nothing was decided.
func unavailable(op string, err error) error {
	return fmt.Errorf("%w: spicedb %s: %w", iam.ErrUnavailable, op, err)
}
