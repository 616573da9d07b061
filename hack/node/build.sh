#!/usr/bin/env bash
# Builds what a real node's guest holds into bin/node/ (or $MACHINIST_BIN/node):
# the pinned kubelet (from hack/controlplane's k8s.io/kubernetes) and, in
# kubelets/, the kubelet of the minor before it (hack/node/kubelet-v1.36), which
# a real node is updated in place from, containerd,
# its runc shim, ctr and runc (from this module), the CNI plugins, and the
# images every node imports at boot (hack/nodeimages). Nothing is downloaded
# at run time: the Go module proxy serves the sources. A stamp of the pins
# makes every later call return at once; a lock lets parallel callers share
# one build.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${MACHINIST_BIN:-$root/bin}/node
mkdir -p "$bin/cni" "$bin/images"

exec 9>"$bin/.lock"
flock 9

cp=$root/hack/controlplane
prev=$here/kubelet-v1.36
stamp=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" "$cp/go.mod" "$cp/go.sum" "$prev/go.mod" "$prev/go.sum" "$root"/hack/nodeimages/*.go "$root"/hack/nodeimages/*/*.go | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$bin/.stamp" 2>/dev/null)" == "$stamp" ]]; then
	exit 0
fi
echo "building the kubelet, containerd, runc and the CNI plugins into $bin (the first time takes a few minutes)" >&2

# kubelet builds the kubelet of the module in $1 into $2, stamped with the
# version that module requires, as `kubelet --version` and its Node report.
kubelet() {
	local v minor ldflags="-s -w"
	v=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$1/go.mod")
	minor=${v#v1.}
	minor=${minor%%.*}
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	# Static binaries: the guest holds no C library.
	(cd "$1" && CGO_ENABLED=0 go build -ldflags "$ldflags" -o "${2/@/$v}" k8s.io/kubernetes/cmd/kubelet)
}
kubelet "$cp" "$bin/"
mkdir -p "$bin/kubelets"
kubelet "$prev" "$bin/kubelets/kubelet-@"
(cd "$here" && CGO_ENABLED=0 go build -ldflags "-s -w" -tags "no_btrfs no_devmapper no_zfs" -o "$bin/" \
	github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	github.com/containerd/containerd/v2/cmd/ctr)
(cd "$here" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$bin/cni/" \
	github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/plugins/plugins/main/loopback github.com/containernetworking/plugins/plugins/meta/portmap)
# runc needs cgo (its nsenter runs before the Go runtime) and libseccomp
# (containerd gives every pod sandbox the runtime's default seccomp
# profile), both linked statically. libseccomp-dev is a Debian package.
if [[ ! -e /usr/lib/x86_64-linux-gnu/libseccomp.a ]]; then
	sudo=()
	((EUID == 0)) || sudo=(sudo)
	echo "Installing libseccomp-dev, which runc links..." >&2
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get install -y -q libseccomp-dev >/dev/null ||
		{ "${sudo[@]}" apt-get update -q >/dev/null && "${sudo[@]}" apt-get install -y -q libseccomp-dev >/dev/null; } ||
		{ echo "build.sh: runc needs libseccomp-dev (Debian), and apt-get could not install it" >&2; exit 1; }
fi
(cd "$here" && CGO_ENABLED=1 go build -ldflags "-s -w -extldflags -static" -tags "seccomp netgo osusergo" -o "$bin/runc" github.com/opencontainers/runc)
(cd "$root" && go run ./hack/nodeimages --out "$bin/images")
echo "$stamp" >"$bin/.stamp"
