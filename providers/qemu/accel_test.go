package qemu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/machinist-dev/machinist/providers/qemu/guest"
)

// fakeQEMU writes a QEMU stand-in that acts out a probe boot: it writes
// console to the file its -serial names, then sleeps for sleep seconds.
func fakeQEMU(t *testing.T, console string, sleep int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	script := `#!/bin/sh
while [ $# -gt 0 ]; do
	case "$1" in -serial) serial="${2#file:}"; shift ;; esac
	shift
done
printf '%s' "` + console + `" > "$serial"
sleep ` + strconv.Itoa(sleep) + `
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// KVM is chosen only when a probe boot under it reaches the guest's init
// within the bound; otherwise TCG, and the log says why.
func TestTheAcceleratorIsProbedNotAssumed(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "kvm")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := kvmDevice
	t.Cleanup(func() { kvmDevice = old })
	for _, c := range []struct {
		name, console string
		sleep         int
		want, says    string
	}{
		{"answers", guest.ProbeLine + "0b5c\n", 0, AccelKVM, "a probe boot reached the guest's init"},
		{"hangs", "Decompressing Linux... Parsing ELF... done.\n", 9, AccelTCG, "no answer from the guest's init within 1s"},
		{"fails", "", 0, AccelTCG, "the guest powered off without reaching its init"},
		{"no device", "", 0, AccelTCG, "KVM is not available"},
	} {
		t.Run(c.name, func(t *testing.T) {
			kvmDevice = dev
			if c.name == "no device" {
				kvmDevice = filepath.Join(t.TempDir(), "none")
			}
			var logged []string
			h := &vms{opts: Options{
				StateDir: t.TempDir(), QEMU: fakeQEMU(t, c.console, c.sleep), ProbeTimeout: time.Second,
				Log: funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{}),
			}}
			start := time.Now()
			if got := h.chooseAccel(h.initrd[GuestAgent]); got != c.want {
				t.Errorf("chose %s, want %s", got, c.want)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("the probe took %s, past its bound", took)
			}
			if all := strings.Join(logged, "\n"); !strings.Contains(all, c.says) {
				t.Errorf("the log says %q, not why (%q)", all, c.says)
			}
		})
	}
}
