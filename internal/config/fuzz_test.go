package config

import (
	"errors"
	"testing"
)

// FuzzLoadFile: any file either loads or fails with an *Error; it never
// panics and never fails with another error type.
func FuzzLoadFile(f *testing.F) {
	f.Add(fullYAML)
	f.Add(`{"capacity": {"maxBatch": 8}, "trustedProxies": ["::/0"]}`)
	f.Add("sinks: {usage: []}")
	f.Add("a: &x {b: *x}")
	f.Add("workers: {batchSize: 1e3}")
	f.Fuzz(func(t *testing.T, file string) {
		c, err := run(file, nil)
		if err != nil {
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		if c.Database == "" || len(c.Roles) == 0 {
			t.Fatalf("loaded without database or roles: %+v", c)
		}
	})
}
