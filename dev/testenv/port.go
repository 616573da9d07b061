package testenv

import (
	"testing"

	"github.com/machinist-dev/machinist/internal/freeport"
)

// FreePort is a TCP port on the loopback interface that nobody listens on
// now, for a process a test starts.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return port
}
