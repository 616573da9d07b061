package nodeagent

import (
	"bufio"
	"errors"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Host is what a real machine's kernel says of itself, for a Node's
// status.nodeInfo.
type Host struct {
	// BootID is the kernel's ID of this boot.
	BootID string
	// KernelVersion is the kernel's release (uname -r).
	KernelVersion string
	// OSImage is the OS's PRETTY_NAME from /etc/os-release.
	OSImage string
	// MachineID is /etc/machine-id, empty when there is none.
	MachineID string
}

// ReadHost reads the running kernel's boot ID and release, and the OS's
// name.
func ReadHost() (Host, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return Host{}, err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return Host{}, err
	}
	h := Host{BootID: strings.TrimSpace(string(b)), KernelVersion: unix.ByteSliceToString(uts.Release[:]), OSImage: "Linux"}
	if id, err := os.ReadFile("/etc/machine-id"); err == nil {
		h.MachineID = strings.TrimSpace(string(id))
	}
	f, err := os.Open("/etc/os-release")
	if errors.Is(err, os.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return Host{}, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "PRETTY_NAME="); ok {
			if unq, err := strconv.Unquote(v); err == nil {
				v = unq
			}
			h.OSImage = v
		}
	}
	return h, s.Err()
}
