// Package blobtest runs a real S3-compatible server for tests: versitygw
// (github.com/versity/versitygw, Apache 2.0), an S3 gateway over a
// directory, on a loopback port with a temporary directory, stopped at the
// test's end. The binary is built once per machine from the Go module
// proxy into .service/bin at the module root (`make tools` does the same
// ahead; .ci/run calls it).
package blobtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"computeplane/internal/blob"
	"computeplane/internal/proctest"
)

// Module and Version pin the server (the Makefile's VERSITYGW names the
// same).
const (
	Module  = "github.com/versity/versitygw/cmd/versitygw"
	Version = "v1.8.0"
)

// Server is one running versitygw with one bucket.
type Server struct {
	Endpoint  string // http://127.0.0.1:<port>
	AccessKey string
	SecretKey string
	Bucket    string
	Dir       string // the directory it serves (one subdirectory per bucket)
}

// Binary returns the versitygw binary, building it into .service/bin when
// it is missing (minutes, once per machine; one build at a time).
func Binary(t testing.TB) string {
	t.Helper()
	return proctest.ToolBinary(t, "versitygw", proctest.GoInstall(Module, Version))
}

// Start runs a server with a fresh bucket; the test's cleanup stops it and
// removes its directory.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{AccessKey: "test-" + token(8), SecretKey: token(20), Bucket: "bucket-" + token(4), Dir: t.TempDir()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	s.Endpoint = "http://" + addr
	c := s.client()
	proctest.StartServer(t, proctest.ServerSpec{
		Name: "versitygw",
		Bin:  Binary(t),
		Args: []string{"--port", addr, "posix", s.Dir},
		// Credentials through its environment, never on a command line
		// others can read.
		Env: []string{"ROOT_ACCESS_KEY_ID=" + s.AccessKey, "ROOT_SECRET_ACCESS_KEY=" + s.SecretKey},
		// Ready when it takes the bucket.
		Ready: func(ctx context.Context) error {
			_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &s.Bucket})
			return err
		},
	})
	return s
}

func (s *Server) client() *s3.Client {
	return s3.New(s3.Options{Region: blob.DefaultRegion, BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey, Source: "blobtest"}, nil
		}),
		HTTPClient: &http.Client{Timeout: 10 * time.Second}})
}

// URL is the store URL of prefix in the server's bucket, as the blob
// options take it.
func (s *Server) URL(prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s", s.Bucket, prefix, s.Endpoint)
}

// Env is the credentials' environment for a process using the server.
func (s *Server) Env() map[string]string {
	return map[string]string{blob.EnvAccessKeyID: s.AccessKey, blob.EnvSecretAccessKey: s.SecretKey}
}

// Store opens the blob store of prefix on the server.
func (s *Server) Store(t testing.TB, prefix string) *blob.S3 {
	t.Helper()
	cfg, err := blob.ParseURL(s.URL(prefix))
	require.NoError(t, err)
	cfg, err = cfg.WithEnv(func(k string) string { return s.Env()[k] })
	require.NoError(t, err)
	st, err := blob.Open(cfg)
	require.NoError(t, err)
	return st
}

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
