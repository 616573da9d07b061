package testenv

import (
	"net"
	"testing"
)

// FreePort is a TCP port on the loopback interface that nobody listens on
// now, for a process a test starts.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
