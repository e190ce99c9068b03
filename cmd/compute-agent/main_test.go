package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 21: `run --runtime qemu` on a host without qemu refused to do
// nothing; it started, and every instance failed later.
func TestRunRefusesWithoutQEMU(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no qemu-system-x86_64, no qemu-img
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run([]string{"run", "--dir", dir, "--runtime", "qemu"}, &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "needs qemu-system-x86_64, which is not on PATH")
	assert.Contains(t, stderr.String(), "apt-get install qemu-system-x86")
	assert.NoFileExists(t, filepath.Join(dir, "accel"), "no acceleration was decided")
}

// A qemu that does not run (a broken install) is refused the same way.
func TestRunRefusesABrokenQEMU(t *testing.T) {
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "qemu-system-x86_64"), []byte("#!/bin/sh\necho 'error while loading shared libraries' >&2\nexit 127\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "qemu-img"), []byte("#!/bin/sh\necho 'qemu-img version 9'\n"), 0o755))
	t.Setenv("PATH", bin)
	var stdout, stderr bytes.Buffer
	code := run([]string{"run", "--dir", t.TempDir(), "--runtime", "qemu"}, &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "qemu-system-x86_64")
	assert.Contains(t, stderr.String(), "does not run")
	assert.Contains(t, stderr.String(), "error while loading shared libraries")

	// qemu-img missing alone is named too.
	require.NoError(t, os.WriteFile(filepath.Join(bin, "qemu-system-x86_64"), []byte("#!/bin/sh\necho 'QEMU emulator version 9'\n"), 0o755))
	require.NoError(t, os.Remove(filepath.Join(bin, "qemu-img")))
	stderr.Reset()
	code = run([]string{"run", "--dir", t.TempDir(), "--runtime", "qemu"}, &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "needs qemu-img, which is not on PATH")
}

// Issue 27: every node-telemetry setting out of bounds refuses the start
// with INVALID_CONFIG naming the flag, before the daemon opens anything.
func TestRunRefusesBadTelemetrySettings(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--telemetry-endpoint", "http://collector.example.com:4318"}, "--telemetry-endpoint"},
		{[]string{"--telemetry-endpoint", "https://u:p@collector.example.com"}, "--telemetry-endpoint"},
		{[]string{"--telemetry-endpoint", "https://collector.example.com", "--telemetry-interval", "4s"}, "--telemetry-interval"},
		{[]string{"--telemetry-endpoint", "https://collector.example.com", "--telemetry-interval", "61m"}, "--telemetry-interval"},
		{[]string{"--telemetry-endpoint", "https://collector.example.com", "--telemetry-attribute", "k=" + strings.Repeat("v", 257)}, "--telemetry-attribute"},
		{[]string{"--telemetry-endpoint", "https://collector.example.com", "--telemetry-attribute", "k=two\nlines"}, "--telemetry-attribute"},
		// The restore pool's bounds, and a pool asked of a runtime that
		// starts no qemu (recording).
		{[]string{"--restore-pool", "9"}, "--restore-pool"},
		{[]string{"--restore-pool", "-1"}, "--restore-pool"},
		{[]string{"--restore-pool-snapshots", "0"}, "--restore-pool-snapshots"},
		{[]string{"--restore-pool", "2"}, "--restore-pool"},
	} {
		dir := t.TempDir()
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"run", "--dir", dir, "--runtime", "recording"}, c.args...), &stdout, &stderr)
		assert.Equal(t, 2, code, "%v", c.args)
		assert.Contains(t, stderr.String(), "INVALID_CONFIG: "+c.flag+":", "%v", c.args)
		entries, _ := os.ReadDir(dir)
		assert.Empty(t, entries, "nothing started: %v", c.args)
	}
	var many []string
	for i := range 33 {
		many = append(many, "--telemetry-attribute", fmt.Sprintf("k%d=v", i))
	}
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"run", "--dir", t.TempDir(), "--runtime", "recording", "--telemetry-endpoint", "http://[::1]:4318"}, many...), &stdout, &stderr)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr.String(), "INVALID_CONFIG: --telemetry-attribute: 33 resource attributes; at most 32")
}
