// Package shutdowntest holds a process test of the api role's shutdown:
// a real computed process with thousands of client connections in every
// state a client can leave one in (calls in flight, idle keep-alive,
// half-sent requests, pipelined answers never read, /watch streams) is
// sent SIGTERM and must exit within the specification's bounds. The
// package has no code of its own; the test is shutdown_test.go.
package shutdowntest
