package tunnels

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/api"
	"computeplane/gen/db"
	"computeplane/internal/agentproto/tunnel"
	"computeplane/internal/iam"
	"computeplane/internal/ids"
	"computeplane/internal/rpc"
	"computeplane/internal/sandboxes"
	"computeplane/internal/store"
)

// Preview URLs (docs/tunnels.md, "Preview URLs"): a guest port served over
// HTTP at {issuer}{basePath}/previews/{targetId}/{port}/ and, with
// tunnels.previewDomain, at <port>-<kind>-<body>.<previewDomain>. Every
// connection the api makes to the guest is a tcp tunnel through the
// node's gateway and daemon, as port-forward's are.

// PreviewTokenHeader carries a private preview's token; the query
// parameter PreviewTokenParam does too (and sets PreviewCookie).
const (
	PreviewTokenHeader = "X-Preview-Token"
	PreviewTokenParam  = "token"
	PreviewCookie      = "compute_preview_token"
)

func previewToken(key []byte, p db.Preview) string {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s\x00%d\x00", p.TargetID, p.Port)
	m.Write(p.Nonce)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// previewHost is the host-based name of a target's port:
// <port>-<kind>-<body> (an id's underscore is not a hostname's).
func previewHost(targetID string, port int32, domain string) string {
	return fmt.Sprintf("%d-%s.%s", port, strings.Replace(targetID, "_", "-", 1), domain)
}

// parsePreviewHost reads a host-based name back; ok false when host is
// not one under domain.
func parsePreviewHost(host, domain string) (string, int, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+domain)
	if !ok || strings.Contains(label, ".") {
		return "", 0, false
	}
	portText, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(portText)
	if !ok || err != nil || port < 1 || port > 65535 {
		return "", 0, false
	}
	kind, body, ok := strings.Cut(id, "-")
	if !ok || (kind != "sbx" && kind != "inst") {
		return "", 0, false
	}
	return kind + "_" + body, port, true
}

// Preview answers tunnels.preview.
func (s *Service) Preview(ctx context.Context, in *api.TunnelsPreviewInput) (*api.Preview, error) {
	if err := s.absent(); err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	if _, _, err := runningVMOf(ctx, q, in.TenantID, in.Target.Kind, in.Target.ID); err != nil {
		return nil, err
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	p := db.EnsurePreviewParams{TargetID: in.Target.ID, Port: int32(in.Port), TenantID: in.TenantID, TargetKind: in.Target.Kind, Nonce: nonce}
	if in.Public != nil {
		p.Public = pgtype.Bool{Bool: *in.Public, Valid: true}
	}
	row, err := q.EnsurePreview(ctx, p)
	if err != nil {
		return nil, err
	}
	out := s.previewAPI(row)
	return &out, nil
}

// ListPreviews answers tunnels.listPreviews.
func (s *Service) ListPreviews(ctx context.Context, in *api.TunnelsListPreviewsInput) (*api.PreviewList, error) {
	if err := s.absent(); err != nil {
		return nil, err
	}
	_, _, q, err := iam.CallFromContext(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.ListPreviews(ctx, in.TenantID)
	if err != nil {
		return nil, err
	}
	out := &api.PreviewList{Items: make([]api.Preview, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, s.previewAPI(r))
	}
	return out, nil
}

func (s *Service) previewAPI(r db.Preview) api.Preview {
	issuer := strings.TrimSuffix(s.Issuer, "/")
	p := api.Preview{TenantID: r.TenantID, Target: api.TunnelTarget{Kind: r.TargetKind, ID: r.TargetID}, Port: int64(r.Port), Public: r.Public,
		URL:   fmt.Sprintf("%s%s/previews/%s/%d/", issuer, s.BasePath, r.TargetID, r.Port),
		Token: previewToken(s.PreviewKey, r), CreatedAt: stamp(r.CreatedAt), UpdatedAt: stamp(r.UpdatedAt)}
	if s.PreviewDomain != "" {
		// The issuer's scheme and port, the preview's name.
		scheme, rest, _ := strings.Cut(issuer, "://")
		port := ""
		if _, pt, err := net.SplitHostPort(rest); err == nil {
			port = ":" + pt
		}
		u := scheme + "://" + previewHost(r.TargetID, r.Port, s.PreviewDomain) + port + "/"
		p.HostURL = &u
	}
	return p
}

// runningVMOf is the VM and node of a running sandbox or instance of
// tenant.
func runningVMOf(ctx context.Context, q *db.Queries, tenant, kind, id string) (string, string, error) {
	if kind == "sandbox" {
		if !strings.HasPrefix(id, "sbx_") {
			return "", "", api.Errorf(api.CodeInvalidInput, "target.id: a sandbox id (sbx_...)")
		}
		return sandboxes.RunningVM(ctx, q, tenant, id)
	}
	if !strings.HasPrefix(id, "inst_") {
		return "", "", api.Errorf(api.CodeInvalidInput, "target.id: an instance id (inst_...)")
	}
	return runningInstance(ctx, q, tenant, id)
}

// Previews serves preview URLs: {basePath}/previews/{targetId}/{port}/...
// on the api host, and any path of a host-based name under Domain.
type Previews struct {
	Store    *store.Store
	Gateways Dialer
	Key      []byte
	BasePath string
	// Domain is tunnels.previewDomain ("" serves path-based URLs only).
	Domain string
	Log    *slog.Logger

	once  sync.Once
	proxy *httputil.ReverseProxy
	// dials are the guest ports behind the transport's host names, so its
	// pool of connections is per VM and port.
	dials sync.Map // host -> previewDial
}

type previewDial struct {
	node, instance string
	port           int
}

type previewCtxKey struct{}

// IsPreviewHost reports whether a request's Host is a host-based preview.
func (pv *Previews) IsPreviewHost(host string) bool {
	if pv.Domain == "" {
		return false
	}
	_, _, ok := parsePreviewHost(host, pv.Domain)
	return ok
}

func (pv *Previews) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pv.once.Do(pv.init)
	target, port, rest, prefix, ok := pv.route(r)
	if !ok {
		rpc.WriteError(w, pv.Log, api.Errorf(api.CodeNotFound, "a preview URL is %s/previews/{targetId}/{port}/...", pv.BasePath))
		return
	}
	if rest == "" { // the preview's root wants its slash (relative links)
		http.Redirect(w, r, prefix+"/", http.StatusFound)
		return
	}
	ctx := r.Context()
	q := db.New(pv.Store.Pool())
	row, err := q.GetPreview(ctx, db.GetPreviewParams{TargetID: target, Port: int32(port)})
	if errors.Is(err, pgx.ErrNoRows) {
		rpc.WriteError(w, pv.Log, api.Errorf(api.CodeNotFound, "no preview of port %d of %s (tunnels.preview)", port, target))
		return
	}
	if err != nil {
		rpc.WriteError(w, pv.Log, api.Errorf(api.CodeUnavailable, "previews: %s", err.Error()).WithDetails(map[string]any{"retryAfterMs": 1000}))
		return
	}
	query := r.URL.Query()
	fromQuery := query.Get(PreviewTokenParam)
	if !row.Public {
		want := previewToken(pv.Key, row)
		given := r.Header.Get(PreviewTokenHeader)
		if given == "" {
			given = fromQuery
		}
		if given == "" {
			if c, err := r.Cookie(PreviewCookie); err == nil {
				given = c.Value
			}
		}
		if !hmac.Equal([]byte(given), []byte(want)) {
			rpc.WriteError(w, pv.Log, api.Errorf(api.CodeUnauthenticated,
				"this preview is private: its token (tunnels.preview) as ?%s=, the %s header or the cookie the first gives", PreviewTokenParam, PreviewTokenHeader))
			return
		}
		if fromQuery != "" {
			// The first hit with ?token= sets the cookie, so the page's
			// own links and assets need no token.
			http.SetCookie(w, &http.Cookie{Name: PreviewCookie, Value: want, Path: prefix + "/", HttpOnly: true,
				Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
		}
	}
	instance, node, err := runningVMOf(ctx, q, row.TenantID, row.TargetKind, row.TargetID)
	if err != nil {
		rpc.WriteError(w, pv.Log, err)
		return
	}
	if fromQuery != "" {
		query.Del(PreviewTokenParam)
		r.URL.RawQuery = query.Encode()
	}
	host := fmt.Sprintf("p%d.%s.preview.invalid", port, strings.ReplaceAll(instance, "_", "-"))
	pv.dials.Store(host, previewDial{node: node, instance: instance, port: port})
	r = r.WithContext(context.WithValue(ctx, previewCtxKey{}, previewReq{host: host, path: rest}))
	pv.proxy.ServeHTTP(hijackClears{w}, r)
}

type previewReq struct{ host, path string }

// route reads the target, port and the rest of the path of a preview
// request, and the URL prefix the rest is under.
func (pv *Previews) route(r *http.Request) (target string, port int, rest, prefix string, ok bool) {
	if pv.Domain != "" {
		if target, port, ok := parsePreviewHost(r.Host, pv.Domain); ok {
			return target, port, r.URL.EscapedPath(), "", true
		}
	}
	p, ok := strings.CutPrefix(r.URL.EscapedPath(), pv.BasePath+"/previews/")
	if !ok {
		return "", 0, "", "", false
	}
	target, p, _ = strings.Cut(p, "/")
	portText, rest, slash := strings.Cut(p, "/")
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 || (!strings.HasPrefix(target, "sbx_") && !strings.HasPrefix(target, "inst_")) {
		return "", 0, "", "", false
	}
	prefix = fmt.Sprintf("%s/previews/%s/%d", pv.BasePath, target, port)
	if !slash {
		return target, port, "", prefix, true
	}
	return target, port, "/" + rest, prefix, true
}

func (pv *Previews) init() {
	tr := &http.Transport{
		DialContext:         pv.dial,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		// A guest's server answers within this or the request fails;
		// bodies (and upgraded connections) are not bounded by it.
		ResponseHeaderTimeout: 60 * time.Second,
	}
	pv.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			req := pr.In.Context().Value(previewCtxKey{}).(previewReq)
			pr.SetXForwarded()
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", req.host
			pr.Out.URL.Path, pr.Out.URL.RawPath = "", ""
			if u, err := pr.Out.URL.Parse(req.path); err == nil {
				pr.Out.URL.Path, pr.Out.URL.RawPath = u.Path, u.RawPath
			}
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(PreviewTokenHeader)
		},
		Transport:     tr,
		FlushInterval: -1, // stream: server-sent events, long polls
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			rpc.WriteError(w, pv.Log, api.Errorf(api.CodeUnavailable, "the guest's port did not answer: %s", err.Error()).
				WithDetails(map[string]any{"retryAfterMs": 1000}))
		},
	}
}

// dial opens a tcp tunnel to the guest port behind a transport host name.
func (pv *Previews) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, _, _ := net.SplitHostPort(addr)
	v, ok := pv.dials.Load(host)
	if !ok {
		return nil, fmt.Errorf("previews: unknown guest %s", host)
	}
	d := v.(previewDial)
	// The connection outlives the request that dialled it (the pool):
	// only the handshake is bounded by the request and 10 s.
	life, end := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, end)
	timer := time.AfterFunc(10*time.Second, end)
	up, err := pv.Gateways.DialTunnel(life, d.node)
	if err == nil {
		open, _ := json.Marshal(tunnel.Open{TunnelID: ids.New("prv"), Kind: tunnel.KindTCP, InstanceID: d.instance, Port: d.port})
		err = up.WriteFrame(tunnel.FrameOpen, open)
		if err != nil {
			_ = up.Close()
		}
	}
	stop()
	timer.Stop()
	if err != nil {
		end()
		return nil, err
	}
	return &frameConn{up: up, end: end}, nil
}

// frameConn is a tcp tunnel through the gateway as a net.Conn: stdin
// frames out, stdout frames in, the exit frame its end.
type frameConn struct {
	up  *tunnel.Upstream
	end context.CancelFunc

	rmu  sync.Mutex
	buf  []byte
	rerr error
	wmu  sync.Mutex
}

func (c *frameConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.buf) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		kind, b, err := c.up.ReadFrame()
		switch {
		case err != nil:
			c.rerr = io.EOF
		case kind == tunnel.FrameStdout:
			c.buf = b
		case kind == tunnel.FrameExit:
			var e tunnel.Exit
			c.rerr = io.EOF
			if json.Unmarshal(b, &e) == nil && e.Error != "" {
				c.rerr = errors.New(e.Error)
			}
		}
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *frameConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), tunnel.MaxFrame)]
		if err := c.up.WriteFrame(tunnel.FrameStdin, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// CloseWrite half-closes the guest's connection.
func (c *frameConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.up.WriteFrame(tunnel.FrameEOF, nil)
}

func (c *frameConn) Close() error {
	c.end()
	return c.up.Close()
}

var previewAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.IPv6Loopback(), 0))

func (c *frameConn) LocalAddr() net.Addr                { return previewAddr }
func (c *frameConn) RemoteAddr() net.Addr               { return previewAddr }
func (c *frameConn) SetDeadline(t time.Time) error      { return nil }
func (c *frameConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *frameConn) SetWriteDeadline(t time.Time) error { return nil }

// hijackClears lets an upgraded preview (a WebSocket) outlive the
// server's deadlines, and keeps flushing reachable.
type hijackClears struct{ http.ResponseWriter }

func (h hijackClears) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return clearDeadlines(h).Hijack()
}

func (h hijackClears) Unwrap() http.ResponseWriter { return h.ResponseWriter }
