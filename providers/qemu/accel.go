package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/machinist-dev/machinist/providers/qemu/guest"
)

// kvmDevice is KVM's device; tests point it elsewhere.
var kvmDevice = "/dev/kvm"

// chooseAccel picks the accelerator the VMs run with: the one configured,
// else KVM if a probe boot under it reaches the guest's init in time. A
// host's /dev/kvm is no promise: under nested virtualisation a guest can
// hang right after its kernel decompresses, and TCG, slower, still boots.
// The log says which was chosen and why.
func (h *vms) chooseAccel(initrd string) string {
	log := h.opts.Log
	if h.opts.Accel != "" {
		log.Info("Running the VMs with the accelerator configured", "accelerator", h.opts.Accel)
		return h.opts.Accel
	}
	f, err := os.OpenFile(kvmDevice, os.O_RDWR, 0)
	if err != nil {
		log.Info("Running the VMs under TCG emulation: KVM is not available", "reason", err.Error())
		return AccelTCG
	}
	_ = f.Close()
	start := time.Now()
	if err := h.probe(initrd); err != nil {
		log.Info("Running the VMs under TCG emulation: a probe boot under KVM failed", "reason", err.Error(), "bound", h.opts.ProbeTimeout)
		return AccelTCG
	}
	log.Info("Running the VMs under KVM: a probe boot reached the guest's init", "took", time.Since(start).Round(time.Millisecond))
	return AccelKVM
}

// probe boots the kernel and initramfs under KVM, into the guest's probe
// mode, which prints guest.ProbeLine and powers off.
func (h *vms) probe(initrd string) error {
	dir, err := os.MkdirTemp(h.opts.StateDir, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	console := filepath.Join(dir, "console.log")
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.ProbeTimeout)
	defer cancel()
	// Memory enough for a real node's initramfs too, the first boot's.
	cmd := exec.CommandContext(ctx, h.opts.QEMU, "-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "pc", "-accel", "kvm", "-cpu", "host", "-m", "1024",
		"-kernel", h.opts.Kernel.Image, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet -- "+guest.Probe,
		"-serial", "file:"+console, "-no-reboot")
	// Killed at the bound, it may leave its output open to a child of
	// its own: the bound holds all the same.
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	b, _ := os.ReadFile(console)
	if strings.Contains(string(b), guest.ProbeLine) {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("no answer from the guest's init within %s", h.opts.ProbeTimeout)
	}
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return errors.New("the guest powered off without reaching its init")
}

// runQMP runs one command on the QMP socket of the VM in dir. The socket
// is reached through the directory's descriptor, so that the path's
// length, which a Unix socket's address bounds, does not depend on where
// the state directory is.
func runQMP(ctx context.Context, dir, command string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	timeout := 5 * time.Second
	if deadline, ok := ctx.Deadline(); ok {
		timeout = time.Until(deadline)
	}
	mon, err := qmp.NewSocketMonitor("unix", fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), qmpSocket), timeout)
	if err != nil {
		return fmt.Errorf("QMP: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		err := mon.Connect()
		if err == nil {
			_, err = mon.Run([]byte(command))
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = mon.Disconnect()
	if err != nil {
		return fmt.Errorf("QMP %s: %w", command, err)
	}
	return nil
}
