package webhooks

import (
	"time"

	"computeplane/gen/api"
	"computeplane/internal/config"
	"computeplane/internal/keys"
)

// DefaultMaxPerTenant is the specification's default limit of webhooks per
// tenant (Limits: "Webhooks per tenant").
const DefaultMaxPerTenant = 20

// Options configure the webhooks group: the API methods (New) and the
// delivery engine (NewEngine) read the same ones.
type Options struct {
	// Key seals the signing secrets: keys.Derive(secret, keys.Webhooks),
	// 32 bytes. Another length panics in New and NewEngine (a wiring
	// mistake, never an input).
	Key []byte
	// MaxPerTenant is the number of webhooks a tenant may hold; 0 means
	// DefaultMaxPerTenant.
	MaxPerTenant int
	// AcceptAnyPattern accepts patterns that match nothing in the event
	// catalog (rule 1's deployment switch).
	AcceptAnyPattern bool
	// AllowPrivateTargets lets URLs and connections reach private,
	// loopback and other non-public addresses: for tests and on-premises
	// installs whose receivers live on private networks.
	AllowPrivateTargets bool
	// EventTypes is the event catalog webhooks.eventTypes answers and
	// patterns are checked against; nil means api.EventTypes.
	EventTypes []api.EventSpec
	// Now is the clock of every time the group writes (due times, claim
	// expiry, the webhook-timestamp header); nil means time.Now.
	Now func() time.Time
}

// OptionsFrom reads the deployment's webhooks options.
func OptionsFrom(cfg *config.Config) Options {
	return Options{
		Key:                 keys.Derive(cfg.Secret, keys.Webhooks),
		MaxPerTenant:        cfg.Webhooks.MaxPerTenant,
		AcceptAnyPattern:    cfg.Webhooks.AcceptAnyPattern,
		AllowPrivateTargets: cfg.Webhooks.AllowPrivateTargets,
	}
}

func (o Options) maxPerTenant() int {
	if o.MaxPerTenant <= 0 {
		return DefaultMaxPerTenant
	}
	return o.MaxPerTenant
}

func (o Options) eventTypes() []api.EventSpec {
	if o.EventTypes == nil {
		return api.EventTypes
	}
	return o.EventTypes
}

func (o Options) clock() func() time.Time {
	if o.Now == nil {
		return time.Now
	}
	return o.Now
}
