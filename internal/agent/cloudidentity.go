package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"computeplane/internal/agentproto"
)

// CloudMetadataTimeout bounds the read of the identity document.
const CloudMetadataTimeout = 10 * time.Second

// maxIdentityBytes bounds the document read from the metadata service.
const maxIdentityBytes = 8 << 10

// CloudIdentity reads this machine's signed instance-identity document
// for the join endpoint api from its provider's metadata service:
// endpoint is unix:PATH (a socket the provider gives the machine) or an
// http URL to a link-local or loopback host (such as
// http://169.254.169.254). The control plane's cloud attestor verifies it.
func CloudIdentity(ctx context.Context, endpoint, api string) (string, error) {
	hc := &http.Client{Timeout: CloudMetadataTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	base := strings.TrimRight(endpoint, "/")
	if path, ok := strings.CutPrefix(endpoint, "unix:"); ok {
		hc.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}
		base = "http://metadata"
	} else {
		u, err := url.Parse(endpoint)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return "", fmt.Errorf("agent: --cloud-metadata %q is neither unix:PATH nor an http URL", endpoint)
		}
		if ip := net.ParseIP(u.Hostname()); u.Scheme == "http" && (ip == nil || !ip.IsLinkLocalUnicast() && !ip.IsLoopback()) {
			return "", fmt.Errorf("agent: --cloud-metadata %q: http only to a link-local or loopback address", endpoint)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, CloudMetadataTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		base+agentproto.InstanceIdentityPath+"?audience="+url.QueryEscape(agentproto.JoinAudience(api)), nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Metadata-Flavor", "computeplane") // as GCP's, refused by services to requests without it
	res, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("agent: the metadata service: %w", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxIdentityBytes+1))
	if err != nil {
		return "", fmt.Errorf("agent: the metadata service: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("agent: the metadata service answered %s: %s", res.Status, strings.TrimSpace(string(body)))
	}
	if len(body) > maxIdentityBytes {
		return "", fmt.Errorf("agent: the identity document is over %d bytes", maxIdentityBytes)
	}
	return strings.TrimSpace(string(body)), nil
}
