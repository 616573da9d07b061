// Package freeport picks a TCP port on the loopback interface that nobody
// listens on, for a process that is about to.
package freeport

import "net"

// Loopback is a port on 127.0.0.1 free now. Another process may take it
// before the caller listens: callers that keep the port say what they do
// when it is taken.
func Loopback() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}
