// Command marker is the tests' container: it logs that it started and
// then that it is alive, and on SIGTERM logs it and leaves a mark in its
// termination message, which the kubelet reports in the container's
// status: proof that it was given its grace. Run with "echo" and words
// (kubectl exec), it prints the words and exits.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// terminationLog is where the kubelet reads a container's termination
// message (terminationMessagePath's default).
const terminationLog = "/dev/termination-log"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "echo" {
		fmt.Println(strings.Join(os.Args[2:], " "))
		return
	}
	host, _ := os.Hostname()
	fmt.Printf("marker: started in %s\n", host)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(5 * time.Second)
	for {
		select {
		case s := <-sig:
			fmt.Printf("marker: %s received, stopping\n", s)
			_ = os.WriteFile(terminationLog, []byte("marker: stopped on "+s.String()+"\n"), 0o644)
			return
		case <-tick.C:
			fmt.Println("marker: alive")
		}
	}
}
