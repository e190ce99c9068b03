// Package benchkit is what the load tools share: a database of their own
// for a run, a free port, and writing their section into the benchmarks
// pages.
package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
)

// FreshDatabase makes a database named prefix_<random> on base's server
// and returns its URL and a function that drops it.
func FreshDatabase(ctx context.Context, base, prefix string) (string, func(), error) {
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + "_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		_ = admin.Close(ctx)
		return "", nil, err
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	}, nil
}

// FreePort is a TCP port free on loopback now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WriteSection puts section (which starts with heading) into each page
// not empty: a tool names the benchmarks page and the notes page, which
// make bench copies after its own tables, so the next make bench keeps
// the section instead of dropping it.
func WriteSection(heading, section string, pages ...string) error {
	for _, p := range pages {
		if p == "" {
			continue
		}
		if err := ReplaceSection(p, heading, section); err != nil {
			return err
		}
	}
	return nil
}

// ReplaceSection puts section in place of the one whose heading line is
// heading (up to the next "## "), or at the end of the file. The whole
// line must match: "## Network" is not "## Network: what the figures say".
func ReplaceSection(path, heading, section string) error {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	s := string(b)
	if i := headingAt(s, heading); i >= 0 {
		rest := s[i+len(heading):]
		end := len(s)
		if j := strings.Index(rest, "\n## "); j >= 0 {
			end = i + len(heading) + j + 1
		}
		s = s[:i] + section + s[end:]
	} else {
		if s != "" && !strings.HasSuffix(s, "\n\n") {
			s += "\n"
		}
		s += section
	}
	return os.WriteFile(path, []byte(strings.TrimRight(s, "\n")+"\n"), 0o644)
}

// headingAt is the offset of the line that is heading alone, or -1.
func headingAt(s, heading string) int {
	for off := 0; ; {
		i := strings.Index(s[off:], heading)
		if i < 0 {
			return -1
		}
		i += off
		end := i + len(heading)
		if (i == 0 || s[i-1] == '\n') && (end == len(s) || s[end] == '\n' || s[end] == '\r') {
			return i
		}
		off = end
	}
}
