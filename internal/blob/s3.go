package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// S3 is a Store over an S3-compatible server.
type S3 struct {
	cfg     Config
	client  *s3.Client
	presign *s3.PresignClient
}

var _ Store = (*S3)(nil)

// OpTimeout bounds one call to the server when the caller's context has
// no earlier deadline.
const OpTimeout = 30 * time.Second

// Open makes the store of cfg (credentials filled, see WithEnv). It opens
// no connection.
func Open(cfg Config) (*S3, error) {
	if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
		return nil, fmt.Errorf("blob: s3://%s: no credentials: set %s and %s", cfg.Bucket, EnvAccessKeyID, EnvSecretAccessKey)
	}
	hc := &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: OpTimeout,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
	}}
	opts := s3.Options{
		Region:       cfg.Region,
		Credentials:  static(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken),
		UsePathStyle: cfg.PathStyle,
		HTTPClient:   hc,
		// Checksums only where S3 requires them: self-hosted servers differ
		// in the trailing checksums they take, and a presigned PUT must not
		// name one its uploader cannot compute ahead.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		RetryMaxAttempts:           3,
	}
	if cfg.Endpoint != "" {
		opts.BaseEndpoint = aws.String(cfg.Endpoint)
	}
	c := s3.New(opts)
	return &S3{cfg: cfg, client: c, presign: s3.NewPresignClient(c)}, nil
}

// Config is the store's configuration.
func (s *S3) Config() Config { return s.cfg }

func (s *S3) key(k string) (*string, error) {
	if err := CheckKey(k); err != nil {
		return nil, err
	}
	return aws.String(s.cfg.Prefix + k), nil
}

func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) < OpTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, OpTimeout)
}

// Put stores size bytes of body under key.
func (s *S3) Put(ctx context.Context, key string, body io.Reader, size int64) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.cfg.Bucket, Key: k, Body: body, ContentLength: aws.Int64(size)})
	return wrap("put", key, err)
}

// Get returns key's bytes; the context bounds the whole read.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, Object, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, Object{}, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.cfg.Bucket, Key: k})
	if err != nil {
		return nil, Object{}, wrap("get", key, err)
	}
	o := Object{Key: key, Size: aws.ToInt64(out.ContentLength)}
	if out.LastModified != nil {
		o.Modified = *out.LastModified
	}
	return out.Body, o, nil
}

// GetFrom returns key's bytes from offset to the end (an HTTP Range
// request), for readers that seek; offset 0 is the whole object. The
// context bounds the whole read.
func (s *S3) GetFrom(ctx context.Context, key string, offset int64) (io.ReadCloser, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, err
	}
	in := &s3.GetObjectInput{Bucket: &s.cfg.Bucket, Key: k}
	if offset > 0 {
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", offset))
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, wrap("get", key, err)
	}
	return out.Body, nil
}

// Stat returns key's size and modification time; ErrNotFound when there
// is none.
func (s *S3) Stat(ctx context.Context, key string) (Object, error) {
	k, err := s.key(key)
	if err != nil {
		return Object{}, err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.cfg.Bucket, Key: k})
	if err != nil {
		return Object{}, wrap("stat", key, err)
	}
	o := Object{Key: key, Size: aws.ToInt64(out.ContentLength)}
	if out.LastModified != nil {
		o.Modified = *out.LastModified
	}
	return o, nil
}

// Delete removes key; a key that is gone is no error.
func (s *S3) Delete(ctx context.Context, key string) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	_, err = s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.cfg.Bucket, Key: k})
	if err = wrap("delete", key, err); errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// List returns the objects under prefix (relative to the store's), by key.
func (s *S3) List(ctx context.Context, prefix string) ([]Object, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var out []Object
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.cfg.Bucket, Prefix: aws.String(s.cfg.Prefix + prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, wrap("list", prefix, err)
		}
		for _, o := range page.Contents {
			obj := Object{Key: aws.ToString(o.Key)[len(s.cfg.Prefix):], Size: aws.ToInt64(o.Size)}
			if o.LastModified != nil {
				obj.Modified = *o.LastModified
			}
			out = append(out, obj)
		}
	}
	return out, nil
}

// PresignPut signs a PUT of exactly size bytes: Content-Length is a signed
// header, so a server checking Signature Version 4 refuses a body of any
// other size.
func (s *S3) PresignPut(ctx context.Context, key string, size int64, ttl time.Duration) (Presigned, error) {
	k, err := s.key(key)
	if err != nil {
		return Presigned{}, err
	}
	if size < 0 {
		return Presigned{}, fmt.Errorf("blob: presign put %s: negative size", key)
	}
	r, err := s.presign.PresignPutObject(ctx, &s3.PutObjectInput{Bucket: &s.cfg.Bucket, Key: k, ContentLength: aws.Int64(size)},
		s3.WithPresignExpires(ttl))
	if err != nil {
		return Presigned{}, fmt.Errorf("blob: presign put %s: %w", key, err)
	}
	h := r.SignedHeader.Clone()
	h.Del("Host")
	if h.Get("Content-Length") == "" {
		// Signed or not, the uploader sends it.
		h.Set("Content-Length", fmt.Sprint(size))
	}
	return Presigned{Method: r.Method, URL: r.URL, Headers: h, ExpiresAt: time.Now().Add(ttl)}, nil
}

// PresignGet signs a GET of key.
func (s *S3) PresignGet(ctx context.Context, key string, ttl time.Duration) (Presigned, error) {
	k, err := s.key(key)
	if err != nil {
		return Presigned{}, err
	}
	r, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: &s.cfg.Bucket, Key: k}, s3.WithPresignExpires(ttl))
	if err != nil {
		return Presigned{}, fmt.Errorf("blob: presign get %s: %w", key, err)
	}
	h := r.SignedHeader.Clone()
	h.Del("Host")
	return Presigned{Method: r.Method, URL: r.URL, Headers: h, ExpiresAt: time.Now().Add(ttl)}, nil
}

// wrap names the operation and turns the server's "no such key" into
// ErrNotFound.
func wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var ae smithy.APIError
	if errors.As(err, &nsk) || errors.As(err, &nf) || (errors.As(err, &ae) && (ae.ErrorCode() == "NoSuchKey" || ae.ErrorCode() == "NotFound")) {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return fmt.Errorf("blob: %s %s: %w", op, key, err)
}

// static is fixed credentials.
func static(id, secret, session string) aws.CredentialsProvider {
	return aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: session, Source: "blob"}, nil
	})
}
