package orphans

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcess is not a test: the test below runs this binary as a
// parent that starts a child, guards it, reports its pid and waits to be
// killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("ORPHANS_HELPER") != "1" {
		return
	}
	if exe := os.Getenv("ORPHANS_EXECUTABLE"); exe != "" {
		// Guarded by its executable, as the chaos tests guard agents
		// that the managers start.
		child := exec.Command(exe, "300")
		if err := child.Start(); err != nil {
			os.Exit(2)
		}
		if err := GuardExecutable(exe); err != nil {
			os.Exit(4)
		}
		os.Stdout.WriteString(strconv.Itoa(child.Process.Pid) + "\n")
		// On purpose: this helper process lives on until the test kills it.
		time.Sleep(time.Minute)
		os.Exit(5)
	}
	child := exec.Command("sleep", "300")
	if err := child.Start(); err != nil {
		os.Exit(2)
	}
	if got := Children("sleep"); len(got) != 1 || got[0] != child.Process.Pid {
		os.Exit(3)
	}
	if err := Guard(child.Process.Pid); err != nil {
		os.Exit(4)
	}
	os.Stdout.WriteString(strconv.Itoa(child.Process.Pid) + "\n")
	// On purpose: this helper process lives on until the test kills it.
	time.Sleep(time.Minute)
	os.Exit(5)
}

func TestAKilledParentTakesItsChildrenWithIt(t *testing.T) {
	killedWithParent(t)
}

func TestAKilledParentTakesTheProcessesOfItsExecutableWithIt(t *testing.T) {
	// A copy of sleep of this test's own, so that no other sleep dies.
	exe := filepath.Join(t.TempDir(), "sleeper")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	killedWithParent(t, "ORPHANS_EXECUTABLE="+exe)
	if err := GuardExecutable("relative/path"); err == nil {
		t.Error("GuardExecutable accepted a relative path")
	}
}

// killedWithParent runs the helper as a parent with env, kills it, and
// checks that the child it reported dies too.
func killedWithParent(t *testing.T, env ...string) {
	t.Helper()
	parent := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	parent.Env = append(append(os.Environ(), "ORPHANS_HELPER=1"), env...)
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = parent.Process.Kill()
		t.Fatalf("the helper reported no child (exit %v)", parent.Wait())
	}
	child, _ := strconv.Atoi(line[:len(line)-1])
	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(child, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("child %d outlived its SIGKILLed parent by 10s", child)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
