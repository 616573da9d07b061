package guest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a console several daemons write to at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSuperviseRestartsWhatExitsAndStopsInReverse: a daemon that dies is
// started again two seconds later (once: it runs then), as a service manager restarts a
// kubelet, while the others run on; a stop ends them all, the last
// started first (the kubelet before containerd).
func TestSuperviseRestartsWhatExitsAndStopsInReverse(t *testing.T) {
	out := &syncBuffer{}
	starts := filepath.Join(t.TempDir(), "starts")
	exits := make(chan *service, 2)
	first := &service{name: "first", argv: []string{"sleep", "60"}}
	// It dies the first time, and runs once started again.
	second := &service{name: "second", argv: []string{"sh", "-c", "echo x >> " + starts + "; [ $(wc -l < " + starts + ") -gt 1 ] && exec sleep 60; exit 3"}}
	for _, s := range []*service{first, second} {
		if err := s.start(out, exits); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() { done <- supervise(out, stop, exits, first, second) }()
	time.Sleep(3 * time.Second)
	stop <- os.Interrupt
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(agentStopTimeout + 5*time.Second):
		t.Fatal("supervise did not return after stop")
	}
	b, _ := os.ReadFile(starts)
	if n := strings.Count(string(b), "x"); n != 2 {
		t.Errorf("the dying daemon started %d times in 3 s, want 2 (restarted once, 2 s after it died)\n%s", n, out)
	}
	con := out.String()
	if !strings.Contains(con, "machinist: init: second exited (exit status 3); starting it again") {
		t.Errorf("the console does not say the daemon was restarted:\n%s", con)
	}
	if strings.Contains(con, "first exited") {
		t.Errorf("the daemon that kept running was restarted:\n%s", con)
	}
	stopFirst := strings.Index(con, "stopping first")
	if stopFirst < 0 || first.cmd.ProcessState == nil {
		t.Fatalf("the running daemon was not stopped:\n%s", con)
	}
	if i := strings.Index(con, "stopping second"); i < 0 || i > stopFirst {
		t.Errorf("not stopped last started first:\n%s", con)
	}
}

// TestSuperviseReturnsARestartThatFails: a daemon whose binary is gone
// cannot be started again; the others are stopped and the error is
// init's, which powers the machine off for its health check to heal.
func TestSuperviseReturnsARestartThatFails(t *testing.T) {
	out := &syncBuffer{}
	script := filepath.Join(t.TempDir(), "daemon")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	exits := make(chan *service, 2)
	running := &service{name: "running", argv: []string{"sleep", "60"}}
	gone := &service{name: "gone", argv: []string{script}}
	for _, s := range []*service{running, gone} {
		if err := s.start(out, exits); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(script); err != nil {
		t.Fatal(err)
	}
	err := supervise(out, make(chan os.Signal), exits, running, gone)
	if err == nil || !strings.Contains(err.Error(), "starting gone") {
		t.Fatalf("got %v, want the failed restart", err)
	}
	if running.cmd.ProcessState == nil {
		t.Errorf("the other daemon was left running:\n%s", out)
	}
}

// TestAStopRunsWhatFollowsADaemon: a real node's pods are stopped once
// its kubelet has ended and before containerd is asked to, whether the
// kubelet was running at the stop or had died and waited to be started
// again.
func TestAStopRunsWhatFollowsADaemon(t *testing.T) {
	for _, dying := range []bool{false, true} {
		out := &syncBuffer{}
		exits := make(chan *service, 2)
		containerd := &service{name: "containerd", argv: []string{"sleep", "60"}}
		argv := []string{"sleep", "60"}
		if dying {
			argv = []string{"sh", "-c", "exit 1"}
		}
		kubelet := &service{name: "kubelet", argv: argv, then: func(out io.Writer) { fmt.Fprintln(out, "pods stopped") }}
		for _, s := range []*service{containerd, kubelet} {
			if err := s.start(out, exits); err != nil {
				t.Fatal(err)
			}
		}
		stop := make(chan os.Signal, 1)
		done := make(chan error, 1)
		go func() { done <- supervise(out, stop, exits, containerd, kubelet) }()
		time.Sleep(time.Second)
		stop <- os.Interrupt
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		con := out.String()
		pods, stopContainerd := strings.Index(con, "pods stopped"), strings.Index(con, "stopping containerd")
		if pods < 0 || stopContainerd < 0 || pods > stopContainerd || strings.Count(con, "pods stopped") != 1 {
			t.Errorf("kubelet dying %v: the pods not stopped once, between the kubelet and containerd:\n%s", dying, con)
		}
		if !dying && strings.Index(con, "stopping kubelet") > pods {
			t.Errorf("the pods stopped before the kubelet:\n%s", con)
		}
	}
}

// TestAContainersGraceIsItsPodsUpToTheBound: the kubelet's annotation
// gives the pod's terminationGracePeriodSeconds; more than
// PodShutdownGrace, or none that can be read, is PodShutdownGrace.
func TestAContainersGraceIsItsPodsUpToTheBound(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"5": 5 * time.Second, "0": 0, "3600": PodShutdownGrace, "": PodShutdownGrace, "x": PodShutdownGrace, "-1": PodShutdownGrace,
	} {
		if got := containerGrace(map[string]string{gracePeriodAnnotation: in}); got != want {
			t.Errorf("grace %q: got %s, want %s", in, got, want)
		}
	}
}

// TestInitWaitsForASlowDaemonAsLongAsItRuns: containerd under emulation
// on a loaded host has taken more than 10 s to make its socket, and init
// gave up at 10 s and powered the machine off for good. It waits while
// the daemon runs; the daemon's exit before it serves is an error that
// names it, and a stop ends the wait.
func TestInitWaitsForASlowDaemonAsLongAsItRuns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, script string
		stop         bool
		want         string // "" when it serves
	}{
		{name: "slow", script: "sleep 12; touch $0; exec sleep 60"},
		{name: "dies", script: "exit 3", want: "dies exited before it served at "},
		{name: "stopped", script: "exec sleep 60", stop: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			socket := filepath.Join(t.TempDir(), "sock")
			exits := make(chan *service, 1)
			s := &service{name: c.name, argv: []string{"sh", "-c", c.script, socket}}
			if err := s.start(io.Discard, exits); err != nil {
				t.Fatal(err)
			}
			defer s.stop(io.Discard)
			stop := make(chan os.Signal, 1)
			if c.stop {
				stop <- os.Interrupt
			}
			start := time.Now()
			stopped, err := awaitServing(s, socket, exits, stop)
			switch {
			case stopped != c.stop:
				t.Fatalf("stopped = %v, want %v", stopped, c.stop)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			case c.want == "" && err != nil:
				t.Fatal(err)
			}
			if c.name == "slow" {
				if _, err := os.Stat(socket); err != nil {
					t.Fatalf("returned after %s before the daemon served: %v", time.Since(start), err)
				}
			}
		})
	}
}
