package config

// Admission sheds load in front of the RPC envelope (internal/admission).
// The specification leaves a general request rate limit "not shown"; this
// option is ours (docs/protocol.md, "Admission").
type Admission struct {
	// MaxInFlight is the most calls one api process runs at once: 0 turns
	// the limit off, AutoInFlight (the default) is InFlightPerConn times
	// the api's database pool.
	MaxInFlight int
	// TenantRate is calls per second per tenant and api process (0, the
	// default: none), TenantBurst the bucket (default twice the rate,
	// at least 1).
	TenantRate  float64
	TenantBurst int
}

// AutoInFlight asks for the default in-flight limit.
const AutoInFlight = -1

// InFlightPerConn is the default in-flight limit per connection of the
// api's pool: a few calls decode, decide and encode while one holds the
// connection, and past that another call in flight only queues.
const InFlightPerConn = 4

type fileAdmission struct {
	MaxInFlight *int     `yaml:"maxInFlight"`
	TenantRate  *float64 `yaml:"tenantRate"`
	TenantBurst *int     `yaml:"tenantBurst"`
}

func (b *builder) admission(fc *fileConfig, c *Config) error {
	fa := deref(fc.Admission, fileAdmission{})
	c.Admission.MaxInFlight = AutoInFlight
	if fa.MaxInFlight != nil {
		if *fa.MaxInFlight < 0 {
			return b.errorf("admission.maxInFlight", "must be at least 0 (0 turns the limit off)")
		}
		c.Admission.MaxInFlight = *fa.MaxInFlight
	}
	c.Admission.TenantRate = deref(fa.TenantRate, 0)
	if c.Admission.TenantRate < 0 {
		return b.errorf("admission.tenantRate", "must be at least 0 (0 turns the limit off)")
	}
	if fa.TenantBurst != nil {
		if c.Admission.TenantRate == 0 {
			return b.errorf("admission.tenantBurst", "needs admission.tenantRate")
		}
		if *fa.TenantBurst < 1 {
			return b.errorf("admission.tenantBurst", "must be at least 1")
		}
		c.Admission.TenantBurst = *fa.TenantBurst
	} else if c.Admission.TenantRate > 0 {
		c.Admission.TenantBurst = max(1, int(2*c.Admission.TenantRate))
	}
	return nil
}
