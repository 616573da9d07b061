package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestALoopbackPortIsFreeToListenOn(t *testing.T) {
	port, err := Loopback()
	if err != nil {
		t.Fatal(err)
	}
	if port <= 0 || port > 65535 {
		t.Fatalf("port %d", port)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("port %d is not free: %v", port, err)
	}
	_ = l.Close()
}
