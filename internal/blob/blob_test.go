package blob_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/blob"
	"computeplane/internal/blob/blobtest"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	c, err := blob.ParseURL("s3://bundles/ops/eu?endpoint=http://127.0.0.1:9000&region=eu-west-1")
	require.NoError(t, err)
	assert.Equal(t, blob.Config{Bucket: "bundles", Prefix: "ops/eu/", Endpoint: "http://127.0.0.1:9000", Region: "eu-west-1", PathStyle: true}, c)

	c, err = blob.ParseURL("s3://my.bucket")
	require.NoError(t, err)
	assert.Equal(t, blob.Config{Bucket: "my.bucket", Region: blob.DefaultRegion}, c)

	for raw, want := range map[string]string{
		"https://bucket/x":                                "s3://",
		"s3://key:secret@bucket/x":                        "credentials",
		"s3://B/x":                                        "bucket",
		"s3://bucket/x?endpoint=ftp://h":                  "endpoint",
		"s3://bucket/x?endpoint=http://h/p":               "endpoint",
		"s3://bucket/x?endpoint=http://u:p@h":             "endpoint",
		"s3://bucket/x?acl=public":                        "unknown parameter",
		"s3://bucket/x?endpoint=http://h&pathStyle=maybe": "pathStyle",
	} {
		_, err := blob.ParseURL(raw)
		require.Error(t, err, raw)
		assert.Contains(t, err.Error(), want, raw)
	}

	_, err = blob.Config{Bucket: "b"}.WithEnv(func(string) string { return "" })
	require.ErrorContains(t, err, "AWS_ACCESS_KEY_ID")
}

// TestS3 runs the store against a real S3 server (versitygw): put, get,
// list, delete, and presigned requests, the PUT admitting its signed size
// only.
func TestS3(t *testing.T) {
	t.Parallel()
	srv := blobtest.Start(t)
	st := srv.Store(t, "bundles")
	ctx := t.Context()

	require.NoError(t, st.Put(ctx, "a/one.txt", strings.NewReader("hello"), 5))
	require.NoError(t, st.Put(ctx, "b/two.txt", strings.NewReader("world!"), 6))
	rc, o, err := st.Get(ctx, "a/one.txt")
	require.NoError(t, err)
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	assert.Equal(t, "hello", string(b))
	assert.Equal(t, int64(5), o.Size)

	all, err := st.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, all, 2)
	assert.Equal(t, "a/one.txt", all[0].Key)
	assert.Equal(t, "b/two.txt", all[1].Key)
	only, err := st.List(ctx, "b/")
	require.NoError(t, err)
	require.Len(t, only, 1)

	_, _, err = st.Get(ctx, "missing")
	require.ErrorIs(t, err, blob.ErrNotFound)
	require.NoError(t, st.Delete(ctx, "a/one.txt"))
	require.NoError(t, st.Delete(ctx, "a/one.txt"), "deleting twice")
	_, _, err = st.Get(ctx, "a/one.txt")
	require.ErrorIs(t, err, blob.ErrNotFound)

	// The prefix is the store's: another prefix sees none of it.
	other, err := srv.Store(t, "elsewhere").List(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, other)

	hc := &http.Client{Timeout: 10 * time.Second}
	body := bytes.Repeat([]byte("x"), 1000)
	put, err := st.PresignPut(ctx, "up/bundle.tar.gz", int64(len(body)), time.Minute)
	require.NoError(t, err)
	assert.Equal(t, http.MethodPut, put.Method)
	assert.Contains(t, put.URL, "X-Amz-SignedHeaders=content-length", "the size is signed")
	send := func(p blob.Presigned, data []byte) int {
		req, err := http.NewRequestWithContext(ctx, p.Method, p.URL, bytes.NewReader(data))
		require.NoError(t, err)
		for k, v := range p.Headers {
			if k != "Content-Length" {
				req.Header[k] = v
			}
		}
		req.ContentLength = int64(len(data))
		resp, err := hc.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	// More, or fewer, bytes than signed: the server refuses them.
	assert.Equal(t, http.StatusForbidden, send(put, append(body, 'y')))
	assert.Equal(t, http.StatusForbidden, send(put, body[:10]))
	_, _, err = st.Get(ctx, "up/bundle.tar.gz")
	require.ErrorIs(t, err, blob.ErrNotFound)
	assert.Equal(t, http.StatusOK, send(put, body))

	get, err := st.PresignGet(ctx, "up/bundle.tar.gz", time.Minute)
	require.NoError(t, err)
	resp, err := hc.Get(get.URL)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, body, got)

	// A presigned GET of a deleted object finds nothing; a signature
	// tampered with is refused.
	resp, err = hc.Get(strings.Replace(get.URL, "X-Amz-Signature=", "X-Amz-Signature=0", 1))
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.NoError(t, st.Delete(ctx, "up/bundle.tar.gz"))
	resp, err = hc.Get(get.URL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)

	require.Error(t, st.Put(ctx, "../escape", strings.NewReader(""), 0))
}
