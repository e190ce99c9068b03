package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// exchange is one call's request body and answer, carried by the context
// through the generated client to the transport.
//
// Why not the typed values: the generated input types decode leniently
// (unknown fields dropped, defaults filled in, required fields checked
// locally), so an input typed through them would not be the input the user
// wrote, and the server, the one authority on inputs, could not name its
// issues. The generated output types re-encode date-times without their
// milliseconds and drop fields they do not know. So the typed method is
// called for everything else it does (route, credentials, X-Service,
// status and error decoding, the answer's shape) while the body sent is the
// JSON built from flags and --input, byte for byte, and the data printed is
// the data the server wrote.
type exchange struct {
	body      []byte // sent as the request body
	response  []byte // the body of the answer
	requestID string // the answer's X-Request-Id
}

type exchangeKey struct{}

func withExchange(ctx context.Context, x *exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, x)
}

// exchangeTransport sends the exchange's body in place of the encoded typed
// input and keeps the answer's body.
type exchangeTransport struct{ base http.RoundTripper }

func (t exchangeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	x, _ := r.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return t.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	if r.Body != nil {
		_ = r.Body.Close()
	}
	body := x.body
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read the answer: %w", err)
	}
	x.response = data
	x.requestID = resp.Header.Get("X-Request-Id")
	resp.Body = io.NopCloser(bytes.NewReader(data))
	return resp, nil
}

// data is the data member of a success answer, as the server wrote it.
func (x *exchange) data() ([]byte, error) {
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(x.response, &env); err != nil {
		return nil, fmt.Errorf("the answer is not a success envelope: %w", err)
	}
	if len(env.Data) == 0 {
		return nil, fmt.Errorf("the answer has no data")
	}
	return env.Data, nil
}
