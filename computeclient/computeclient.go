// Package computeclient is the Go client of the compute control plane: the
// client ogen generates from openapi.yaml (gen/client), plus the bearer
// token, the X-Service header and errors that carry the envelope's code,
// message and details.
//
//	c, err := computeclient.New("https://compute.example.com/api/compute", computeclient.WithToken(key))
//	doc, err := c.SystemVersion(ctx, &client.SystemVersionInput{})
//	if e, ok := computeclient.AsError(err); ok && e.Code == "NOT_FOUND" { ... }
package computeclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/ogen-go/ogen/ogenerrors"

	"computeplane/gen/client"
)

// Client is the generated client; every method of the catalog is a method of it.
type Client = client.Client

type options struct {
	token      string
	httpClient *http.Client
	edit       func(*http.Request)
}

// Option configures New.
type Option func(*options)

// WithToken sends Authorization: Bearer token on every call.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithHTTPClient uses c (its transport, timeouts and redirects) for calls.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithRequestEditor lets fn change every request just before it is sent:
// extra headers such as X-Request-Id or traceparent, or, in tests, a request
// the server must refuse.
func WithRequestEditor(fn func(*http.Request)) Option { return func(o *options) { o.edit = fn } }

// New returns a client for the API at apiURL, the public origin followed by
// the base path (http://localhost:3000/api/compute by default).
func New(apiURL string, opts ...Option) (*Client, error) {
	o := options{httpClient: http.DefaultClient}
	for _, opt := range opts {
		opt(&o)
	}
	hc := o.httpClient
	if o.edit != nil {
		copied := *hc
		base := hc.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		copied.Transport = editTransport{base: base, edit: o.edit}
		hc = &copied
	}
	return client.NewClient(apiURL, security{token: o.token}, client.WithClient(hc))
}

// security supplies X-Service: 1 on every call and the bearer token when one is set.
type security struct{ token string }

func (s security) BearerAuth(context.Context, client.OperationName) (client.BearerAuth, error) {
	if s.token == "" {
		return client.BearerAuth{}, ogenerrors.ErrSkipClientSecurity
	}
	return client.BearerAuth{Token: s.token}, nil
}

func (s security) ServiceHeader(context.Context, client.OperationName) (client.ServiceHeader, error) {
	return client.ServiceHeader{APIKey: "1"}, nil
}

type editTransport struct {
	base http.RoundTripper
	edit func(*http.Request)
}

func (t editTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	t.edit(r)
	return t.base.RoundTrip(r)
}

// Error is an error answer of the API.
type Error struct {
	Status       int            // HTTP status
	Code         string         // e.g. INVALID_INPUT, NOT_FOUND
	Message      string         // names the first problem
	RetryAfterMs *int64         // when to retry, if the server said
	Details      map[string]any // structured details, e.g. issues
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Message) }

// Issue is one entry of details.issues of an INVALID_INPUT answer.
type Issue struct {
	Message string `json:"message"`
	Path    string `json:"path"`
}

// Issues returns details.issues.
func (e *Error) Issues() []Issue {
	raw, err := json.Marshal(e.Details["issues"])
	if err != nil {
		return nil
	}
	var out []Issue
	_ = json.Unmarshal(raw, &out)
	return out
}

// AsError returns the API error inside err, if there is one.
func AsError(err error) (*Error, bool) {
	var sc *client.ErrorStatusCode
	if !errors.As(err, &sc) {
		return nil, false
	}
	body := sc.Response.Error
	e := &Error{Status: sc.StatusCode, Code: string(body.Code), Message: body.Message}
	if v, ok := body.RetryAfterMs.Get(); ok {
		e.RetryAfterMs = &v
	} else if v, ok := sc.Response.RetryAfterMs.Get(); ok {
		e.RetryAfterMs = &v
	}
	if d, ok := body.Details.Get(); ok {
		e.Details = make(map[string]any, len(d))
		for k, raw := range d {
			var v any
			if json.Unmarshal(raw, &v) == nil {
				e.Details[k] = v
			}
		}
	}
	return e, true
}
