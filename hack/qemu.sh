#!/usr/bin/env bash
# Installs what the qemu provider's VMs need when it is missing: QEMU
# (qemu-system-x86_64), a packaged kernel with its modules (Debian's cloud
# kernel: /boot/vmlinuz-* and /lib/modules/<version>) and mkfs.ext4, which
# makes each VM's disk. Debian packages, installed as root; where that is
# impossible it stops, naming what to install.
set -euo pipefail

kernel_with_modules() {
	local k
	for k in /boot/vmlinuz-*; do
		[[ -e "$k" && -e "/lib/modules/${k#/boot/vmlinuz-}/modules.dep" ]] && return 0
	done
	return 1
}

missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
kernel_with_modules || missing+=(linux-image-cloud-amd64)
command -v mkfs.ext4 >/dev/null || PATH="$PATH:/usr/sbin:/sbin" command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
((${#missing[@]} == 0)) && exit 0

need="the qemu provider needs ${missing[*]} (Debian packages)"
if ! command -v apt-get >/dev/null; then
	echo "$need, and this host has no apt-get: install QEMU for x86-64, a Linux kernel image with its modules under /lib/modules, and e2fsprogs" >&2
	exit 1
fi
sudo=()
if ((EUID != 0)); then
	if ! command -v sudo >/dev/null; then
		echo "$need: run as root, or: sudo apt-get install ${missing[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi
echo "Installing ${missing[*]} for the qemu provider's VMs..."
export DEBIAN_FRONTEND=noninteractive
# The package lists may be stale or absent (a fresh container): refresh
# once if the install fails without them.
if ! "${sudo[@]}" apt-get install -y -q "${missing[@]}" >/dev/null; then
	"${sudo[@]}" apt-get update -q >/dev/null
	"${sudo[@]}" apt-get install -y -q "${missing[@]}" >/dev/null || {
		echo "$need, and apt-get could not install them" >&2
		exit 1
	}
fi
