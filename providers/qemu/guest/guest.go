// Package guest is the inside of a qemu machine: the machinist binary runs
// as the VM's init (PID 1) from the initramfs the provider builds, and this
// package is what it does there. It mounts what the node agent needs,
// loads the modules of the virtual hardware, configures the network of
// QEMU's user-mode net, mounts the machine's own disk and runs the agent,
// restarting it as a service manager would, until Ctrl-Alt-Del (the
// provider's soft reboot) or SIGTERM: then it stops the agent, unmounts the
// disk and restarts the machine, which makes QEMU (run with -no-reboot)
// exit for the provider to boot it again.
//
// What the provider and the guest agree on is here too, so that the two
// sides cannot drift: the kernel command line, the files of the
// initramfs, the fw_cfg entry that carries the join data and the console
// lines the provider reads.
package guest

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The initramfs's files.
const (
	// ModuleDir holds the kernel modules the guest loads, named
	// <name>.ko, and ModuleOrder lists their names one per line, each
	// after the modules it needs.
	ModuleDir   = "/lib/modules"
	ModuleOrder = "/lib/modules/order"
	// OSRelease names the guest's OS for its Node's status.nodeInfo.
	OSRelease = "/etc/os-release"
	// MachineIDFile is the machine's ID, from its disk (see machineID).
	MachineIDFile = "/etc/machine-id"
)

// The guest's devices and paths.
const (
	// Disk is the machine's own disk, an ext4 image the provider makes,
	// mounted at StateDir: what must survive a reboot (the Node's
	// credentials) lives there, and a repair replaces it.
	Disk     = "/dev/vda"
	StateDir = "/var/lib/machinist"
	// Kubeconfig is where the agent keeps the Node's own credentials.
	Kubeconfig = StateDir + "/kubeconfig"
	// BootstrapKubeconfig is the join data copied from fw_cfg, on a
	// tmpfs: it is read afresh at each boot, never kept on the disk.
	BootstrapKubeconfig = "/run/machinist/bootstrap-kubeconfig"
	// JoinName is the fw_cfg entry (QEMU's -fw_cfg name=...) carrying
	// the join data as a bootstrap kubeconfig, as a cloud carries user
	// data: the token never appears on a command line.
	JoinName = "opt/dev.machinist/join"
	joinPath = "/sys/firmware/qemu_fw_cfg/by_name/" + JoinName + "/raw"
)

// The network of QEMU's user-mode net (-netdev user): the guest's address
// and its gateway, which is also the host's loopback.
const (
	Address = "10.0.2.15/24"
	Gateway = "10.0.2.2"
)

// Console lines the provider reads from the serial log.
const (
	// BootLine starts the line that tells a boot's ID, printed before
	// anything else is tried, so the provider knows the boot at once.
	BootLine = "machinist: boot-id "
	// ProbeLine starts the line a probe boot prints before it powers off.
	ProbeLine = "machinist: probe ok "
)

// Probe is the init argument of a probe boot, which only shows that the
// kernel gets as far as init and powers off.
const Probe = "probe"

// agentStopTimeout bounds an orderly shutdown's wait for the agent.
const agentStopTimeout = 10 * time.Second

// IsInit reports whether this process is a machine's init: PID 1, run by
// the kernel as the initramfs' /init. PID 1 alone is not enough: in a
// container (a pod of the image, say) the entrypoint is PID 1 too.
func IsInit() bool { return isInit(os.Getpid(), os.Args[0]) }

func isInit(pid int, argv0 string) bool { return pid == 1 && argv0 == InitPath }

// InitPath is where a machine's initramfs holds the binary, which the
// kernel runs as init.
const InitPath = "/init"

// Init is PID 1's life: args are the words after "--" on the kernel
// command line, the agent's command and flags (or Probe). It never
// returns: the machine restarts, or powers off after a probe or a failure
// to start, since init's exit would panic the kernel.
func Init(args []string) {
	out := console()
	err := mountAll()
	if err == nil {
		fmt.Fprintln(out, BootLine+bootID())
		if len(args) == 1 && args[0] == Probe {
			fmt.Fprintln(out, ProbeLine+bootID())
			halt(unix.LINUX_REBOOT_CMD_POWER_OFF)
		}
		err = setUp()
	}
	if err == nil {
		err = run(out, args)
	}
	if err != nil {
		fmt.Fprintln(out, "machinist: init:", err)
		// Powered off rather than looping: the provider sees the VM off,
		// and the health check heals it as a crashed machine.
		halt(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	halt(unix.LINUX_REBOOT_CMD_RESTART)
}

// console is where init writes: the kernel's console, the serial line the
// provider logs.
func console() io.Writer {
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		return f
	}
	return os.Stdout
}

// mountAll mounts the kernel's file systems and the tmpfs ones.
func mountAll() error {
	for _, m := range []struct{ fs, target string }{
		{"proc", "/proc"}, {"sysfs", "/sys"}, {"devtmpfs", "/dev"}, {"tmpfs", "/run"}, {"tmpfs", "/tmp"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fs, m.target, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s: %w", m.target, err)
		}
	}
	return nil
}

// setUp makes the machine ready for its agent: modules and network.
func setUp() error {
	if err := loadModules(); err != nil {
		return err
	}
	if err := network(); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// bootID is the kernel's ID of this boot, the one the Node reports.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// loadModules loads the modules ModuleOrder lists, in its order.
func loadModules() error {
	f, err := os.Open(ModuleOrder)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		name := strings.TrimSpace(s.Text())
		if name == "" {
			continue
		}
		if err := loadModule(filepath.Join(ModuleDir, name+".ko")); err != nil {
			return fmt.Errorf("loading module %s: %w", name, err)
		}
	}
	return s.Err()
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// network brings up lo and eth0, with the user-mode net's address and its
// gateway as the default route.
func network() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	// The NIC's driver has just been loaded: its link may take a moment.
	var eth netlink.Link
	for deadline := time.Now().Add(10 * time.Second); ; {
		if eth, err = netlink.LinkByName("eth0"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	addr, err := netlink.ParseAddr(Address)
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(eth, addr); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return err
	}
	return netlink.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP(Gateway)})
}

// run mounts the disk, copies the join data and runs the agent, restarted
// whenever it exits, until Ctrl-Alt-Del or SIGTERM; then it stops it in
// order and unmounts the disk.
func run(out io.Writer, args []string) error {
	if len(args) == 0 {
		return errors.New("no agent command on the kernel command line (after --)")
	}
	if err := os.MkdirAll(StateDir, 0o755); err != nil {
		return err
	}
	// A driver just loaded may still be probing its device.
	if err := await(Disk); err != nil {
		return fmt.Errorf("the disk: %w", err)
	}
	if err := unix.Mount(Disk, StateDir, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mounting the disk %s: %w", Disk, err)
	}
	if err := machineID(); err != nil {
		unmount(out)
		return err
	}
	if err := copyJoin(); err != nil {
		unmount(out)
		return err
	}
	// Ctrl-Alt-Del becomes SIGINT to init rather than an instant reset:
	// the provider's soft reboot is an orderly one.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF); err != nil {
		fmt.Fprintln(out, "machinist: init: Ctrl-Alt-Del stays a reset:", err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, unix.SIGINT, unix.SIGTERM)
	if isKubelet(args) {
		err := runNode(out, args[1:], stop)
		unmount(out)
		return err
	}
	self, err := os.Executable()
	if err != nil {
		self = InitPath
	}
	exits := make(chan *service, 1)
	agent := &service{name: "the agent", argv: append([]string{self}, args...)}
	if err := agent.start(out, exits); err != nil {
		unmount(out)
		return err
	}
	err = supervise(out, stop, exits, agent)
	unmount(out)
	return err
}

// machineID gives the machine the ID of its disk, as systemd's
// /etc/machine-id: made at the first boot of a disk and kept on it, so that
// reboots keep it and a repair, which gives a fresh disk, changes it. The
// Node reports it as status.nodeInfo.machineID.
func machineID() error {
	kept := filepath.Join(StateDir, "machine-id")
	id, err := os.ReadFile(kept)
	// One cut short by a power loss as it was first written is made anew.
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(strings.TrimSpace(string(id))) != 32) {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		id = []byte(hex.EncodeToString(b) + "\n")
		if err := writeSynced(kept, id); err != nil {
			return fmt.Errorf("keeping the machine ID: %w", err)
		}
	} else if err != nil {
		return err
	}
	return os.WriteFile(MachineIDFile, id, 0o444)
}

// writeSynced writes a file and makes it durable, so that a power loss
// right after does not leave it empty.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o444)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// copyJoin copies the join data from fw_cfg to a tmpfs, readable by root
// alone, for the agent's --bootstrap-kubeconfig. A machine given none
// (adopted with credentials of its own) runs without.
func copyJoin() error {
	if err := await("/sys/firmware/qemu_fw_cfg/by_name"); err != nil {
		return fmt.Errorf("the join data: %w", err)
	}
	b, err := os.ReadFile(joinPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the join data: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(BootstrapKubeconfig), 0o700); err != nil {
		return err
	}
	return os.WriteFile(BootstrapKubeconfig, b, 0o600)
}

// unmount writes the disk out and unmounts it, so that a restart loses
// nothing the agent wrote.
func unmount(out io.Writer) {
	unix.Sync()
	if err := unix.Unmount(StateDir, 0); err != nil {
		fmt.Fprintln(out, "machinist: init: unmounting the disk:", err)
	}
}

// await waits a few seconds for path to appear.
func await(path string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(path)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func halt(cmd int) {
	unix.Sync()
	_ = unix.Reboot(cmd)
	// Not reached; init must not exit.
	for {
		time.Sleep(time.Hour)
	}
}
