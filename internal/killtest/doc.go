// Package killtest holds the kill test of outbox dispatch (issue 5, "What
// it must show"; docs/killtest.md): real computed processes, one of them
// killed with SIGKILL while it dispatches events to a file sink and a
// webhook receiver, and a count showing that every event still reached
// both at least once after another process took its leases over. The
// package has no code of its own; the test is kill_test.go.
package killtest
