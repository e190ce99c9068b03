package config

import "time"

// Shutdown tunes how a process stops on SIGTERM or SIGINT.
type Shutdown struct {
	// Unready is how long an api process answers /readyz 503 before it
	// closes its listener, still serving every call meanwhile, so that a
	// balancer that checks /readyz stops sending it calls first (0, the
	// default: it closes at once). Set it to the balancer's check
	// interval times its unhealthy threshold.
	Unready time.Duration
}

// MaxUnreadyMs bounds shutdown.unreadyMs: a process asked to stop must
// stop within its supervisor's patience (systemd's TimeoutStopSec is 90 s).
const MaxUnreadyMs = 60000

type fileShutdown struct {
	UnreadyMs *int `yaml:"unreadyMs"`
}

func (b *builder) shutdown(fc *fileConfig, c *Config) error {
	fs := deref(fc.Shutdown, fileShutdown{})
	if fs.UnreadyMs != nil {
		if *fs.UnreadyMs < 0 || *fs.UnreadyMs > MaxUnreadyMs {
			return b.errorf("shutdown.unreadyMs", "must be from 0 to %d", MaxUnreadyMs)
		}
		c.Shutdown.Unready = time.Duration(*fs.UnreadyMs) * time.Millisecond
	}
	return nil
}
