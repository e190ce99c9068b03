// Package blob is the service's S3-compatible blob store: put, get, delete
// and list objects under a prefix of one bucket, and presign PUTs and GETs
// so that another party (a node daemon, an operator's browser) moves the
// bytes without credentials of its own. The client is the AWS SDK for Go
// v2; any server speaking S3 with Signature Version 4 works (AWS S3,
// versitygw, SeaweedFS, Ceph RGW, MinIO ...).
//
// A store is named by a URL, the shape the blob options take
// (supportBundles.blob, downloads.blob):
//
//	s3://<bucket>[/<prefix>][?endpoint=<http(s) URL>&region=<region>&pathStyle=<bool>]
//
// endpoint defaults to AWS's for the region; region to us-east-1;
// pathStyle to true when an endpoint is given (self-hosted servers rarely
// have a DNS name per bucket). The URL never holds credentials: they come
// from the environment, under the names every S3 tool reads
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN).
package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Environment variables of the credentials.
const (
	EnvAccessKeyID     = "AWS_ACCESS_KEY_ID"
	EnvSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	EnvSessionToken    = "AWS_SESSION_TOKEN"
)

// DefaultRegion is the region of a URL that names none.
const DefaultRegion = "us-east-1"

// Config is a parsed store URL plus its credentials.
type Config struct {
	Bucket    string
	Prefix    string // "" or ends with "/"
	Endpoint  string // "" is AWS's
	Region    string
	PathStyle bool

	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
}

// ParseURL reads a store URL (see the package documentation); credentials
// are left for WithEnv.
func ParseURL(raw string) (Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Config{}, fmt.Errorf("not a URL: %w", err)
	}
	switch {
	case u.Scheme != "s3":
		return Config{}, errors.New("must be an s3:// URL: s3://bucket/prefix?endpoint=...&region=...")
	case u.User != nil:
		return Config{}, errors.New("must not hold credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
	case u.Fragment != "":
		return Config{}, errors.New("must not have a fragment")
	case !bucketRe(u.Host):
		return Config{}, fmt.Errorf("bucket %q: 3 to 63 lowercase letters, digits, dots and hyphens", u.Host)
	}
	c := Config{Bucket: u.Host, Region: DefaultRegion}
	if p := strings.Trim(u.Path, "/"); p != "" {
		c.Prefix = p + "/"
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "pathStyle":
		default:
			return Config{}, fmt.Errorf("unknown parameter %q (endpoint, region, pathStyle)", k)
		}
	}
	if e := q.Get("endpoint"); e != "" {
		eu, err := url.Parse(e)
		if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" || eu.User != nil || (eu.Path != "" && eu.Path != "/") || eu.RawQuery != "" {
			return Config{}, fmt.Errorf("endpoint %q: an http or https origin without credentials or path", e)
		}
		c.Endpoint = eu.Scheme + "://" + eu.Host
		c.PathStyle = true
	}
	if r := q.Get("region"); r != "" {
		c.Region = r
	}
	if ps := q.Get("pathStyle"); ps != "" {
		b, err := strconv.ParseBool(ps)
		if err != nil {
			return Config{}, fmt.Errorf("pathStyle %q: true or false", ps)
		}
		c.PathStyle = b
	}
	return c, nil
}

func bucketRe(s string) bool {
	if len(s) < 3 || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}

// WithEnv fills the credentials from getenv; both the key id and the
// secret are required.
func (c Config) WithEnv(getenv func(string) string) (Config, error) {
	c.AccessKeyID, c.SecretAccessKey, c.SessionToken = getenv(EnvAccessKeyID), getenv(EnvSecretAccessKey), getenv(EnvSessionToken)
	if c.AccessKeyID == "" || c.SecretAccessKey == "" {
		return c, fmt.Errorf("no credentials: set %s and %s", EnvAccessKeyID, EnvSecretAccessKey)
	}
	return c, nil
}

// Object is one stored object; Key is relative to the store's prefix.
type Object struct {
	Key      string
	Size     int64
	Modified time.Time
}

// Presigned is a request anyone may make until ExpiresAt: the method, the
// URL and the headers that were signed and must be sent as they are (a
// PUT's Content-Length: the server refuses any other size).
type Presigned struct {
	Method    string
	URL       string
	Headers   http.Header
	ExpiresAt time.Time
}

// ErrNotFound is an object that does not exist.
var ErrNotFound = errors.New("blob: no such object")

// Store is a blob store. Keys are relative to the store's prefix and are
// 1 to 512 characters without a leading slash or "..".
type Store interface {
	Put(ctx context.Context, key string, body io.Reader, size int64) error
	// Get returns the object's bytes (closed by the caller); ErrNotFound
	// when there is none.
	Get(ctx context.Context, key string) (io.ReadCloser, Object, error)
	// Delete removes an object; deleting one that is gone succeeds.
	Delete(ctx context.Context, key string) error
	// List returns the objects whose keys start with prefix, by key.
	List(ctx context.Context, prefix string) ([]Object, error)
	// PresignPut signs a PUT of exactly size bytes to key, good for ttl.
	PresignPut(ctx context.Context, key string, size int64, ttl time.Duration) (Presigned, error)
	// PresignGet signs a GET of key, good for ttl.
	PresignGet(ctx context.Context, key string, ttl time.Duration) (Presigned, error)
}

// CheckKey refuses a key a store does not take.
func CheckKey(key string) error {
	switch {
	case key == "" || len(key) > 512:
		return fmt.Errorf("blob: key %q: 1 to 512 characters", key)
	case strings.HasPrefix(key, "/") || strings.Contains(key, "..") || strings.ContainsAny(key, "\x00\\"):
		return fmt.Errorf("blob: key %q: no leading slash, .. or backslash", key)
	}
	return nil
}
