package provideraccounts_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"computeplane/internal/providers"
)

// The fake provider of these tests: offers from its config, a secret-like
// apiToken resolved at each call (the values seen are recorded), no
// bootstrap capability. Clients built are counted.
const fakeSchema = `{
  "type": "object", "additionalProperties": false, "required": ["region"],
  "properties": {
    "region": {"type": "string", "minLength": 1},
    "apiToken": {"type": "string"},
    "fail": {"type": "boolean"},
    "offers": {"type": "array", "items": {"type": "object"}}
  }
}`

type fakeState struct {
	mu       sync.Mutex
	built    int
	tokens   []string
	queries  []providers.Query
	machines map[string]bool
}

var fake = &fakeState{machines: map[string]bool{"m-1": true}}

type fakeClient struct {
	env providers.Env
	cfg struct {
		Region   string            `json:"region"`
		APIToken string            `json:"apiToken"`
		Fail     bool              `json:"fail"`
		Offers   []providers.Offer `json:"offers"`
	}
}

// fakeFactory is the fake provider, added to the built-in ones by the
// tests' envs (testenv.WithProviders).
var fakeFactory = &providers.Factory{
	Manifest: providers.Manifest{Name: "fake", ConfigSchema: fakeSchema,
		Capabilities: []providers.Capability{providers.CapOffers, providers.CapIdentify, providers.CapClaim, providers.CapRelease}},
	New: func(env providers.Env, raw json.RawMessage) (providers.Provider, error) {
		c := &fakeClient{env: env}
		if err := json.Unmarshal(raw, &c.cfg); err != nil {
			return nil, err
		}
		fake.mu.Lock()
		fake.built++
		fake.mu.Unlock()
		return c, nil
	},
}

func (c *fakeClient) Offers(ctx context.Context, q providers.Query) ([]providers.Offer, error) {
	fake.mu.Lock()
	fake.queries = append(fake.queries, q)
	fake.mu.Unlock()
	if c.cfg.APIToken != "" {
		v, err := c.env.Resolve(ctx, c.cfg.APIToken)
		if err != nil {
			return nil, err
		}
		fake.mu.Lock()
		fake.tokens = append(fake.tokens, v)
		fake.mu.Unlock()
	}
	if c.cfg.Fail {
		return nil, errors.New("the fake cloud is down")
	}
	out := append([]providers.Offer{}, c.cfg.Offers...)
	for i := range out {
		out[i].Region = c.cfg.Region
	}
	return out, nil
}

func (c *fakeClient) Identify(_ context.Context, id string) (providers.Machine, error) {
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if !fake.machines[id] {
		return providers.Machine{}, providers.ErrNoMachine
	}
	return providers.Machine{ID: id, State: "running"}, nil
}

func (c *fakeClient) Claim(context.Context, string, string) (providers.Machine, error) {
	return providers.Machine{}, providers.ErrUnsupported
}
func (c *fakeClient) Release(context.Context, string) error { return nil }
func (c *fakeClient) Install(context.Context, providers.Machine, providers.Install) error {
	return providers.ErrUnsupported
}
func (c *fakeClient) Close() {}
