package ec2_test

// The EC2 provider against recorded answers: an httptest server plays
// EC2's query API from testdata/ (answers in the shape EC2 gives them),
// checks what the SDK sent (the action, its parameters, a SigV4 signature
// made with the resolved key) and counts the resolutions.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/providers"
	"computeplane/internal/providers/ec2"
)

const account = "pacct_0123456789abcdefghjkmnpqrs"

// recorded is the fake EC2 endpoint.
type recorded struct {
	t        *testing.T
	mu       sync.Mutex
	requests []url.Values
	auth     []string
}

func (r *recorded) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	require.NoError(r.t, req.ParseForm())
	r.mu.Lock()
	r.requests = append(r.requests, req.PostForm)
	r.auth = append(r.auth, req.Header.Get("Authorization"))
	r.mu.Unlock()
	answer := func(status int, file string) {
		b, err := os.ReadFile(filepath.Join("testdata", file))
		require.NoError(r.t, err)
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(strings.ReplaceAll(string(b), "ACCOUNT", account)))
	}
	f := req.PostForm
	switch f.Get("Action") {
	case "DescribeInstanceTypes":
		if f.Get("NextToken") == "page-2" {
			answer(200, "DescribeInstanceTypes-2.xml")
		} else {
			answer(200, "DescribeInstanceTypes-1.xml")
		}
	case "DescribeInstances":
		if f.Get("InstanceId.1") == "i-0abcdef1234567890" || f.Get("InstanceId.1") == "i-0fedcba0987654321" {
			answer(200, "DescribeInstances.xml")
		} else {
			answer(400, "error-InvalidInstanceID.NotFound.xml")
		}
	case "RunInstances":
		answer(200, "RunInstances.xml")
	case "TerminateInstances":
		answer(200, "TerminateInstances.xml")
	default:
		http.Error(w, "unexpected action", http.StatusBadRequest)
	}
}

func (r *recorded) last() url.Values {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[len(r.requests)-1]
}

type world struct {
	srv      *recorded
	p        providers.Provider
	resolved []string
}

func setup(t *testing.T, extra map[string]any) *world {
	t.Helper()
	w := &world{srv: &recorded{t: t}}
	hs := httptest.NewServer(w.srv)
	t.Cleanup(hs.Close)
	cfg := map[string]any{"region": "eu-central-1", "accessKeyId": "AKIAIOSFODNN7EXAMPLE", "secretAccessKey": "secret://tenants/acme/aws",
		"endpoint": hs.URL, "imageId": "ami-0123456789abcdef0", "subnetId": "subnet-0123456789abcdef0"}
	for k, v := range extra {
		cfg[k] = v
	}
	issues, err := ec2.Manifest.Check(cfg)
	require.NoError(t, err)
	require.Empty(t, issues)
	raw, _ := json.Marshal(cfg)
	var mu sync.Mutex
	w.p, err = ec2.New(providers.Env{AccountID: account, Resolve: func(_ context.Context, ref string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		w.resolved = append(w.resolved, ref)
		return "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", nil
	}}, raw)
	require.NoError(t, err)
	return w
}

func TestOffers(t *testing.T) {
	t.Parallel()
	w := setup(t, nil)
	offers, err := w.p.Offers(t.Context(), providers.Query{})
	require.NoError(t, err)
	var ids []string
	for _, o := range offers {
		ids = append(ids, o.ID)
	}
	assert.Equal(t, []string{"t3.micro", "m7i.2xlarge", "g6.12xlarge", "c7i.metal-24xl"}, ids, "both pages")
	assert.Equal(t, providers.Offer{ID: "g6.12xlarge", Kind: "vps", Region: "eu-central-1", VCPU: 48, MemoryMiB: 196608, MemoryGiB: 192,
		GPUModel: "L4", GPUs: 4}, offers[2])
	assert.Equal(t, "metal", offers[3].Kind)
	// Signed with SigV4 for the account's key id and region.
	for _, a := range w.srv.auth {
		assert.Contains(t, a, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/")
		assert.Contains(t, a, "/eu-central-1/ec2/aws4_request")
	}
	assert.NotEmpty(t, w.resolved, "the key was resolved for the call")
	for _, r := range w.resolved {
		assert.Equal(t, "secret://tenants/acme/aws", r)
	}

	// A kind asks EC2 for bare-metal types only (or none).
	_, err = w.p.Offers(t.Context(), providers.Query{Kind: "metal"})
	require.NoError(t, err)
	f := w.srv.last()
	assert.Equal(t, "bare-metal", f.Get("Filter.1.Name"))
	assert.Equal(t, "true", f.Get("Filter.1.Value.1"))
}

func TestOffersOfConfiguredTypes(t *testing.T) {
	t.Parallel()
	w := setup(t, map[string]any{"instanceTypes": []any{"t3.micro", "g6.12xlarge"}})
	_, err := w.p.Offers(t.Context(), providers.Query{})
	require.NoError(t, err)
	f := w.srv.requests[0]
	assert.Equal(t, "t3.micro", f.Get("InstanceType.1"))
	assert.Equal(t, "g6.12xlarge", f.Get("InstanceType.2"))
	assert.Empty(t, f.Get("MaxResults"))
}

func TestClaimIdentifyRelease(t *testing.T) {
	t.Parallel()
	w := setup(t, nil)
	ctx := t.Context()
	m, err := w.p.Claim(ctx, "t3.micro", "pbs_0123456789abcdefghjkmnpqrs")
	require.NoError(t, err)
	assert.Equal(t, "i-0abcdef1234567890", m.ID)
	assert.Equal(t, "pending", m.State)
	f := w.srv.last()
	assert.Equal(t, "RunInstances", f.Get("Action"))
	assert.Equal(t, "t3.micro", f.Get("InstanceType"))
	assert.Equal(t, "ami-0123456789abcdef0", f.Get("ImageId"))
	assert.Equal(t, "subnet-0123456789abcdef0", f.Get("SubnetId"))
	assert.Equal(t, "pbs_0123456789abcdefghjkmnpqrs", f.Get("ClientToken"), "the claim key makes a retry idempotent")
	assert.Equal(t, ec2.AccountTag, f.Get("TagSpecification.1.Tag.1.Key"))
	assert.Equal(t, account, f.Get("TagSpecification.1.Tag.1.Value"))

	got, err := w.p.Identify(ctx, m.ID)
	require.NoError(t, err)
	assert.Equal(t, "running", got.State)
	assert.Equal(t, "t3.micro", got.OfferID)
	assert.EqualValues(t, 2, got.VCPU)
	// Another account's instance, an unknown one, something not an id.
	for _, id := range []string{"i-0fedcba0987654321", "i-0000000000000000f", "../x"} {
		_, err := w.p.Identify(ctx, id)
		assert.ErrorIs(t, err, providers.ErrNoMachine, id)
	}
	require.NoError(t, w.p.Release(ctx, m.ID))
	assert.Equal(t, "TerminateInstances", w.srv.last().Get("Action"))
	assert.ErrorIs(t, w.p.Release(ctx, "i-0fedcba0987654321"), providers.ErrNoMachine, "never another account's")
	assert.ErrorIs(t, w.p.Install(ctx, m, providers.Install{}), providers.ErrUnsupported)
}

func TestErrorsNameTheCall(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := os.ReadFile(filepath.Join("testdata", "error-AuthFailure.xml"))
		w.WriteHeader(401)
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	raw, _ := json.Marshal(map[string]any{"region": "eu-central-1", "accessKeyId": "AKIAIOSFODNN7EXAMPLE", "secretAccessKey": "env://COMPUTE_PROVIDER_AWS",
		"endpoint": srv.URL})
	p, err := ec2.New(providers.Env{AccountID: account, Resolve: func(context.Context, string) (string, error) { return "k", nil }}, raw)
	require.NoError(t, err)
	_, err = p.Offers(t.Context(), providers.Query{})
	assert.ErrorContains(t, err, "DescribeInstanceTypes: AuthFailure: AWS was not able to validate")
	_, err = p.Claim(t.Context(), "t3.micro", "k")
	assert.ErrorContains(t, err, "imageId", "no image to launch")
}

func TestManifest(t *testing.T) {
	t.Parallel()
	issues, err := ec2.Manifest.Check(map[string]any{"region": "eu-central-1", "accessKeyId": "AKIAIOSFODNN7EXAMPLE",
		"secretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"})
	require.NoError(t, err)
	require.Len(t, issues, 1)
	assert.Equal(t, "config.secretAccessKey", issues[0].Path, "a key in clear")
	assert.False(t, ec2.Manifest.CanBootstrap())
}
