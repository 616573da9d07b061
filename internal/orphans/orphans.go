// Package orphans keeps the processes a Machinist process starts (etcd,
// kube-apiserver, machine agents) from outliving it when it is killed
// without a chance to stop them: by SIGKILL, or by `go test -timeout`.
// Linux's parent-death signal would do it, but envtest starts the control
// plane without a way to set one; so a small watchdog process waits for
// the parent to die and then kills them.
package orphans

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Guard starts a watchdog that sends SIGKILL to pids once this process is
// gone. The watchdog leaves by itself then; while this process lives it
// checks once a second, which costs nothing worth counting.
func Guard(pids ...int) error {
	if len(pids) == 0 {
		return nil
	}
	list := make([]string, len(pids))
	for i, p := range pids {
		list[i] = strconv.Itoa(p)
	}
	return watchdog("kill -9 " + strings.Join(list, " "))
}

// GuardExecutable is Guard for every process that runs the executable at
// path, whoever started it and whenever: for children's children that
// outlive their parents on purpose (machine agents), whose PIDs are not
// known here. path should be this process's own copy, such as a binary a
// test built into a temporary directory, or it kills others' processes too.
func GuardExecutable(path string) error {
	if !filepath.IsAbs(path) || strings.ContainsAny(path, "'\\ ") {
		return fmt.Errorf("orphans: %q is not an absolute path without quotes, backslashes or spaces", path)
	}
	return watchdog(fmt.Sprintf("pkill -9 -f '^%s( |$)'", path))
}

// watchdog runs kill, a shell command, once this process is gone.
func watchdog(kill string) error {
	script := fmt.Sprintf("while kill -0 %d 2>/dev/null; do sleep 1; done; %s 2>/dev/null; exit 0", os.Getpid(), kill)
	cmd := exec.Command("sh", "-c", script)
	// Its own session: a Ctrl-C to the parent's group must not end it
	// before the parent has stopped.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the orphan watchdog: %w", err)
	}
	// Reap it whenever it ends, so it never lingers as a zombie.
	go func() { _ = cmd.Wait() }()
	return nil
}

// Children lists this process's child processes whose executable's base
// name is one of names.
func Children(names ...string) []int {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	self := os.Getpid()
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(raw)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		if ppid != self || !want[s[open+1:end]] {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
		if err == nil {
			out = append(out, pid)
		}
	}
	return out
}
