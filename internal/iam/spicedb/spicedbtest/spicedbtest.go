// Package spicedbtest runs a real SpiceDB server for tests
// (github.com/authzed/spicedb, Apache 2.0) with the in-memory datastore on
// loopback ports, stopped at the test's end. The binary is built once per
// machine from the Go module proxy into .service/bin at the module root
// (`make tools` does the same ahead; .ci/run calls it).
package spicedbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"testing"
	"time"

	v1 "github.com/authzed/authzed-go/proto/authzed/api/v1"
	authzed "github.com/authzed/authzed-go/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"computeplane/internal/config"
	"computeplane/internal/iam/spicedb"
	"computeplane/internal/proctest"
)

// Module and Version pin the server (the Makefile's SPICEDB names the same).
const (
	Module  = "github.com/authzed/spicedb/cmd/spicedb"
	Version = "v1.56.2"
)

// KeyEnv is the environment variable the service reads the key from.
const KeyEnv = config.DefaultSpiceDBKeyEnv

// Server is one running SpiceDB.
type Server struct {
	Endpoint string // 127.0.0.1:<port> (gRPC, plaintext)
	Key      string // its preshared key

	server *proctest.Server
	shared *authzed.Client
}

// Binary returns the spicedb binary, building it into .service/bin when it
// is missing (minutes, once per machine; one build at a time).
func Binary(t testing.TB) string {
	t.Helper()
	return proctest.ToolBinary(t, "spicedb", proctest.GoInstall(Module, Version))
}

// Start runs a SpiceDB with an empty in-memory datastore; the test's
// cleanup stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{Key: token(16), Endpoint: freeAddr(t)}
	client := s.Client(t)
	s.shared = client
	s.server = proctest.StartServer(t, proctest.ServerSpec{
		Name: "spicedb",
		Bin:  Binary(t),
		Args: []string{"serve",
			"--datastore-engine", "memory",
			"--grpc-addr", s.Endpoint,
			"--http-enabled=false",
			"--metrics-enabled=false",
			"--dispatch-cluster-enabled=false",
			"--telemetry-endpoint=",
			"--skip-release-check",
			"--log-level", "warn",
		},
		// The key through its environment, never on a command line
		// others can read.
		Env: []string{"SPICEDB_GRPC_PRESHARED_KEY=" + s.Key},
		Ready: func(ctx context.Context) error {
			_, err := client.ReadSchema(ctx, &v1.ReadSchemaRequest{})
			// An empty datastore answers NotFound (no schema): it is
			// serving.
			if status.Code(err) == codes.NotFound {
				return nil
			}
			return err
		},
		ReadyWithin: 60 * time.Second,
		PollEvery:   100 * time.Millisecond,
	})
	return s
}

// Client is a client of the server, closed at the test's end.
func (s *Server) Client(t testing.TB) *authzed.Client {
	t.Helper()
	client, err := spicedb.Dial(&config.SpiceDB{Endpoint: s.Endpoint, PresharedKey: s.Key, Plaintext: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// Config is the service's configuration of this server (plaintext to
// loopback) and the environment holding its key.
func (s *Server) Config() (yaml string, env map[string]string) {
	return fmt.Sprintf("iam: {decisions: {spicedb: {endpoint: '%s', plaintext: true}}}\n", s.Endpoint),
		map[string]string{KeyEnv: s.Key}
}

// TypePrefix is the service's default type prefix, which AwaitRole
// assumes.
const TypePrefix = "compute-"

// AwaitWithin bounds AwaitRole: the inbox's delay (a NOTIFY at once, a
// 1 s poll else) with room for a loaded machine.
const AwaitWithin = 10 * time.Second

// AwaitRole waits until the server holds identity's role in tenant: the
// service mirrors role bindings from the identity inbox, after the
// binding committed, not on the authentication path.
func (s *Server) AwaitRole(t testing.TB, tenant, identity, role string) {
	t.Helper()
	rel := spicedb.RoleBinding(TypePrefix, tenant, identity, role)
	filter := &v1.RelationshipFilter{
		ResourceType: rel.Resource.ObjectType, OptionalResourceId: rel.Resource.ObjectId, OptionalRelation: rel.Relation,
		OptionalSubjectFilter: &v1.SubjectFilter{SubjectType: rel.Subject.Object.ObjectType, OptionalSubjectId: rel.Subject.Object.ObjectId},
	}
	client := s.client(t)
	deadline := time.Now().Add(AwaitWithin)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		stream, err := client.ReadRelationships(ctx, &v1.ReadRelationshipsRequest{
			Consistency:        &v1.Consistency{Requirement: &v1.Consistency_FullyConsistent{FullyConsistent: true}},
			RelationshipFilter: filter, OptionalLimit: 1})
		if err == nil {
			_, err = stream.Recv()
		}
		cancel()
		if err == nil {
			return
		}
		require.True(t, time.Now().Before(deadline), "SpiceDB does not hold %s's role %s in %s after %s: %v", identity, role, tenant, AwaitWithin, err)
		time.Sleep(20 * time.Millisecond)
	}
}

// Revision is the datastore's revision (a ZedToken): every write moves it.
func (s *Server) Revision(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := s.client(t).ReadSchema(ctx, &v1.ReadSchemaRequest{})
	require.NoError(t, err)
	return resp.GetReadAt().GetToken()
}

// client is the client Start dialled, closed with the server's test.
func (s *Server) client(testing.TB) *authzed.Client { return s.shared }

// Stop stops the server (an outage); nothing it held survives.
func (s *Server) Stop() { s.server.Stop() }

// Logs returns what the server logged.
func (s *Server) Logs() string { return s.server.Logs() }

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
