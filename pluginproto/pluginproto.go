// Package pluginproto is the protocol between the service and its
// out-of-process plugins (docs/plugins.md): the handshake, the typed
// messages both ends speak, and the gRPC service that carries them over
// github.com/hashicorp/go-plugin. The service (internal/plugins) and every
// plugin main (plugins/example) import it; neither parses the other's JSON
// by hand.
//
// A plugin main is one call:
//
//	func main() { pluginproto.Serve(myMethods{}) }
//
// The messages are Go structs carried as JSON inside a protobuf
// BytesValue, so that a plugin needs no protoc: the gRPC service
// (computeplane.plugin.v1.Methods) has two unary methods, Describe and
// Call. Fields are only ever added and optional; anything else is a new
// Version.
package pluginproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Version is the protocol version: the handshake's ProtocolVersion. A
// plugin built for another version is refused at start.
const Version = 1

// Handshake is what the service and a plugin check before anything else:
// a plugin binary started by hand (without the cookie) says it is a
// plugin and exits.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  Version,
	MagicCookieKey:   "COMPUTEPLANE_PLUGIN",
	MagicCookieValue: "methods-v1",
}

// PluginName is the name the service dispenses a plugin's methods under.
const PluginName = "methods"

// EnvDataDir names the environment variable holding the directory a plugin
// may keep its state in (the plugin's dataDir option); the service makes it
// before starting the plugin.
const EnvDataDir = "COMPUTEPLANE_PLUGIN_DATA"

// Description is what a plugin says of itself when it starts: its id (the
// directory of its catalog, plugins/<id>) and the methods it serves
// (group.method, as its catalog names them). The service refuses a plugin
// whose id differs from the configured one or that lacks a method of its
// catalog.
type Description struct {
	PluginID string   `json:"pluginId"`
	Methods  []string `json:"methods"`
}

// Caller is who made the call, as the service authenticated it.
type Caller struct {
	IdentityID   string `json:"identityId"`
	IdentityKind string `json:"identityKind"`
	TenantID     string `json:"tenantId"`
}

// CallRequest is one validated, decided call. Input is the method's
// generated input type as JSON, defaults applied. The plugin must answer
// before the context's deadline (the call's).
type CallRequest struct {
	// Method is group.method of the plugin's catalog (notes.create).
	Method    string          `json:"method"`
	Input     json.RawMessage `json:"input"`
	Caller    Caller          `json:"caller"`
	RequestID string          `json:"requestId"`
	// ReadOnly is true for a read: the plugin must change nothing and
	// publish no event.
	ReadOnly bool `json:"readOnly"`
}

// Event is an event the call publishes. Type must be one the method
// declares in the catalog (events: [...]); the service writes it into the
// call's transaction with the tenant of the call, so it exists exactly
// when the call committed.
type Event struct {
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Data    json.RawMessage `json:"data"`
}

// Error is a service error the plugin answers: a code of the service's
// catalog (NOT_FOUND, CONFLICT, INVALID_INPUT ...) the method documents.
type Error struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf builds an Error.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CallResponse is the outcome of a call: Error, or Output (the method's
// output type as JSON) and the events to publish.
type CallResponse struct {
	Output json.RawMessage `json:"output,omitempty"`
	Events []Event         `json:"events,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Methods is what a plugin implements.
type Methods interface {
	Describe(ctx context.Context) (*Description, error)
	// Call serves one call. A returned *Error is the call's answer; any
	// other error is the service's INTERNAL_ERROR.
	Call(ctx context.Context, req *CallRequest) (*CallResponse, error)
}

// Serve runs a plugin's main: it answers the service's handshake and
// serves m over gRPC until the service ends it. It does not return.
func Serve(m Methods) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         plugin.PluginSet{PluginName: &GRPCPlugin{Impl: m}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}

// GRPCPlugin is the go-plugin adapter of Methods: the plugin side serves
// Impl, the service side dispenses a Methods that calls over gRPC.
type GRPCPlugin struct {
	// Plugin is the net/rpc side, left nil: only gRPC is served.
	plugin.Plugin
	Impl Methods
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers Impl on the plugin's gRPC server.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&serviceDesc, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns the service side's Methods over conn.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return &client{conn: conn}, nil
}

// The gRPC service, written out instead of generated from a .proto: two
// unary methods whose messages are BytesValue holding the JSON of the
// structs above.
const (
	serviceName    = "computeplane.plugin.v1.Methods"
	methodDescribe = "/" + serviceName + "/Describe"
	methodCall     = "/" + serviceName + "/Call"
)

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Describe", Handler: unary(func(ctx context.Context, s *server, _ []byte) (any, error) {
			return s.impl.Describe(ctx)
		})},
		{MethodName: "Call", Handler: unary(func(ctx context.Context, s *server, in []byte) (any, error) {
			var req CallRequest
			if err := json.Unmarshal(in, &req); err != nil {
				return nil, fmt.Errorf("pluginproto: call request: %w", err)
			}
			resp, err := s.impl.Call(ctx, &req)
			var pe *Error
			if errors.As(err, &pe) {
				return &CallResponse{Error: pe}, nil
			}
			return resp, err
		})},
	},
	Metadata: "pluginproto",
}

type server struct{ impl Methods }

// unary adapts fn to a gRPC method handler: BytesValue in, JSON of fn's
// answer out in a BytesValue.
func unary(fn func(ctx context.Context, s *server, in []byte) (any, error)) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.BytesValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		handle := func(ctx context.Context, req any) (any, error) {
			out, err := fn(ctx, srv.(*server), req.(*wrapperspb.BytesValue).GetValue())
			if err != nil {
				return nil, err
			}
			b, err := json.Marshal(out)
			if err != nil {
				return nil, err
			}
			return wrapperspb.Bytes(b), nil
		}
		if icpt == nil {
			return handle(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + serviceName}, handle)
	}
}

type client struct{ conn *grpc.ClientConn }

func (c *client) invoke(ctx context.Context, method string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp := new(wrapperspb.BytesValue)
	if err := c.conn.Invoke(ctx, method, wrapperspb.Bytes(b), resp); err != nil {
		return err
	}
	return json.Unmarshal(resp.GetValue(), out)
}

func (c *client) Describe(ctx context.Context) (*Description, error) {
	var d Description
	if err := c.invoke(ctx, methodDescribe, struct{}{}, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

func (c *client) Call(ctx context.Context, req *CallRequest) (*CallResponse, error) {
	var resp CallResponse
	if err := c.invoke(ctx, methodCall, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}
