package qemu

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/machinist-dev/machinist/providers/qemu/guest"
)

// modules are the kernel modules the guest loads, each after those it
// needs: the virtio PCI transport, its NIC (with the failover modules
// virtio_net needs), its disk, the balloon through which it hands freed
// pages back to the host, and the fw_cfg files that carry the join data.
// A module the kernel has built in is left out.
var modules = []string{"virtio_pci", "virtio_net", "virtio_blk", "virtio_balloon", "qemu_fw_cfg"}

// Kernel is a packaged kernel the VMs boot, with the modules of its
// version.
type Kernel struct {
	// Image is the kernel (/boot/vmlinuz-<version>).
	Image string
	// Version is its release, as uname -r says in the guest.
	Version string
	// Modules is /lib/modules/<version>.
	Modules string
}

// FindKernel picks the newest kernel under /boot whose modules are
// installed in /lib/modules: a packaged kernel, such as Debian's
// linux-image-cloud-amd64, rather than whatever the host runs.
func FindKernel() (Kernel, error) {
	images, err := filepath.Glob("/boot/vmlinuz-*")
	if err != nil {
		return Kernel{}, err
	}
	var found []Kernel
	for _, image := range images {
		version := strings.TrimPrefix(filepath.Base(image), "vmlinuz-")
		mods := filepath.Join("/lib/modules", version)
		if _, err := os.Stat(filepath.Join(mods, "modules.dep")); err == nil {
			found = append(found, Kernel{Image: image, Version: version, Modules: mods})
		}
	}
	if len(found) == 0 {
		return Kernel{}, errors.New("no kernel in /boot with its modules in /lib/modules: install one, such as Debian's linux-image-cloud-amd64")
	}
	// The newest is last.
	sort.Slice(found, func(i, j int) bool { return olderVersion(found[i].Version, found[j].Version) })
	return found[len(found)-1], nil
}

// olderVersion compares kernel releases such as 6.1.0-9-cloud-amd64 and
// 6.1.0-48-cloud-amd64 as people do: runs of digits by their value.
func olderVersion(a, b string) bool {
	for a != "" && b != "" {
		da, db := leadingDigits(a), leadingDigits(b)
		switch {
		case da != "" && db != "":
			na, _ := strconv.Atoi(da)
			nb, _ := strconv.Atoi(db)
			if na != nb {
				return na < nb
			}
			a, b = a[len(da):], b[len(db):]
		case a[0] != b[0]:
			return a[0] < b[0]
		default:
			a, b = a[1:], b[1:]
		}
	}
	return len(a) < len(b)
}

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// moduleFiles lists the files of names and of the modules they need,
// each after those it needs, from the kernel's modules.dep; built-in
// modules are left out.
func (k Kernel) moduleFiles(names []string) ([]string, error) {
	deps, err := readModulesDep(filepath.Join(k.Modules, "modules.dep"))
	if err != nil {
		return nil, err
	}
	byName := map[string]string{}
	for path := range deps {
		byName[moduleName(path)] = path
	}
	builtin, _ := os.ReadFile(filepath.Join(k.Modules, "modules.builtin"))
	var order []string
	var add func(path string)
	add = func(path string) {
		if slices.Contains(order, path) {
			return
		}
		// modules.dep lists every module a module needs, the ones
		// needed last first: loaded in reverse, each comes after its own.
		d := deps[path]
		for i := len(d) - 1; i >= 0; i-- {
			add(d[i])
		}
		order = append(order, path)
	}
	for _, name := range names {
		path, ok := byName[name]
		if !ok {
			if strings.Contains(string(builtin), "/"+name+".ko\n") {
				continue
			}
			return nil, fmt.Errorf("kernel %s has no module %s", k.Version, name)
		}
		add(path)
	}
	return order, nil
}

// readModulesDep reads modules.dep: "path: dep dep ..." per module.
func readModulesDep(path string) (map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	deps := map[string][]string{}
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		mod, rest, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
	}
	return deps, s.Err()
}

// moduleName is a module's name from its path: dashes and underscores
// are one to the kernel, and file names use either.
func moduleName(path string) string {
	name := strings.TrimSuffix(filepath.Base(path), ".ko")
	return strings.ReplaceAll(name, "-", "_")
}

// initramfs is a VM's root file system: the guest binary as /init, the
// modules it loads and what names its OS.
type initramfs struct {
	kernel Kernel
	// binary is the static machinist binary the guest runs.
	binary string
	// osImage names the guest's OS in its Node's status.
	osImage string
	// node, when set, makes the image a real node's: containerd, the
	// kubelet and their files.
	node *NodeFiles
}

// build writes the initramfs, gzip-compressed, under dir, named after a
// hash of what it holds so that a provider started again, or another
// one, reuses it; it returns the path.
func (r initramfs) build(dir string) (string, error) {
	names, kind := modules, GuestAgent
	var extra []nodeFile
	if r.node != nil {
		names, kind = append(slices.Clone(modules), nodeModules...), GuestKubelet
		var err error
		if extra, err = r.node.files(); err != nil {
			return "", err
		}
	}
	mods, err := r.kernel.moduleFiles(names)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", r.kernel.Version, r.osImage, strings.Join(mods, " "))
	if err := hashFile(h, r.binary); err != nil {
		return "", fmt.Errorf("the guest binary: %w", err)
	}
	for _, f := range extra {
		fmt.Fprintf(h, "%s %o\n", f.path, f.mode)
		if f.src == "" {
			h.Write(f.data)
		} else if err := hashFile(h, f.src); err != nil {
			return "", err
		}
	}
	prefix := "initramfs-" + kind + "-"
	if r.node != nil && r.node.kubelet != "" {
		// Each kubelet's images apart: a build for one version must not
		// prune another's that a VM is about to boot.
		sum := sha256.Sum256([]byte(r.node.kubelet))
		prefix += hex.EncodeToString(sum[:4]) + "-"
	}
	path := filepath.Join(dir, prefix+hex.EncodeToString(h.Sum(nil))[:16]+".cpio.gz")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".initramfs-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := r.write(tmp, mods, extra); err != nil {
		_ = tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	// Images of other binaries go: QEMU reads its initramfs as it
	// starts, so no running VM needs its file, and each is tens of MB.
	old, _ := filepath.Glob(filepath.Join(dir, prefix+"*.cpio.gz"))
	for _, o := range old {
		if o != path {
			_ = os.Remove(o)
		}
	}
	return path, nil
}

func (r initramfs) write(w io.Writer, mods []string, extra []nodeFile) error {
	// The fastest compression: the kernel unpacks it in the guest's own
	// memory, and a VM of 256 MiB must hold the archive and its files.
	z, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	a := &cpioWriter{w: z}
	made := map[string]bool{}
	for _, d := range []string{"/dev", "/proc", "/sys", "/run", "/tmp", "/etc", "/lib", guest.ModuleDir, "/var", "/var/lib", guest.StateDir} {
		a.dir(d)
		made[d] = true
	}
	a.device("/dev/console", 5, 1)
	release := fmt.Sprintf("PRETTY_NAME=%q\nNAME=\"Machinist\"\nID=machinist\n", r.osImage)
	a.file(guest.OSRelease, 0o644, []byte(release))
	var order []string
	for _, m := range mods {
		b, err := os.ReadFile(filepath.Join(r.kernel.Modules, m))
		if err != nil {
			return err
		}
		name := moduleName(m)
		a.file(filepath.Join(guest.ModuleDir, name+".ko"), 0o644, b)
		order = append(order, name)
	}
	a.file(guest.ModuleOrder, 0o644, []byte(strings.Join(order, "\n")+"\n"))
	bin, err := os.ReadFile(r.binary)
	if err != nil {
		return err
	}
	a.file(guest.InitPath, 0o755, bin)
	for _, f := range extra {
		// Each directory once, before what it holds.
		var parents []string
		for d := filepath.Dir(f.path); d != "/" && !made[d]; d = filepath.Dir(d) {
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			made[parents[i]] = true
			a.dir(parents[i])
		}
		data := f.data
		if f.src != "" {
			if data, err = os.ReadFile(f.src); err != nil {
				return err
			}
		}
		a.file(f.path, f.mode, data)
	}
	if err := a.close(); err != nil {
		return err
	}
	return z.Close()
}

func hashFile(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, f)
	return err
}

// cpioWriter writes the "newc" cpio format the kernel unpacks an
// initramfs from. The first error sticks and is returned by close.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeChar = 0o020000
)

func (c *cpioWriter) dir(name string) { c.entry(name, modeDir|0o755, 0, 0, nil) }

func (c *cpioWriter) file(name string, perm int, data []byte) {
	c.entry(name, modeFile|perm, 0, 0, data)
}

func (c *cpioWriter) device(name string, major, minor int) {
	c.entry(name, modeChar|0o600, major, minor, nil)
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	return c.err
}

func (c *cpioWriter) entry(name string, mode, rmajor, rminor int, data []byte) {
	if c.err != nil {
		return
	}
	name = strings.TrimPrefix(name, "/")
	c.ino++
	nlink := 1
	if mode&modeDir != 0 {
		nlink = 2
	}
	// ino, mode, uid, gid, nlink, mtime (0: the same bytes every time),
	// filesize, devmajor, devminor, rdevmajor, rdevminor, namesize, check.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	c.write([]byte(hdr + name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad aligns to four bytes after n bytes written.
func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}
