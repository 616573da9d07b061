#!/usr/bin/env bash
# Builds the pinned etcd (with etcdctl and etcdutl), kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl into bin/ (or
# $MACHINIST_BIN).
#
# Nothing prebuilt can be downloaded, so the binaries come from source through
# the Go module proxy. The first build takes several minutes on two cores; a
# stamp of the pins makes every later call return at once. A lock lets test
# packages that start in parallel call this safely.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${MACHINIST_BIN:-$root/bin}
mkdir -p "$bin"

exec 9>"$bin/.controlplane.lock"
flock 9

stamp=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" "$here/etcd/main.go" "$here/etcd/tools.go" | sha256sum | cut -d' ' -f1)
if [[ -x $bin/etcd && -x $bin/etcdctl && -x $bin/etcdutl && -x $bin/kube-apiserver && -x $bin/kube-controller-manager && -x $bin/kube-scheduler && -x $bin/kubectl && "$(cat "$bin/.controlplane.stamp" 2>/dev/null)" == "$stamp" ]]; then
	exit 0
fi

# required prints the version go.mod $2 requires of module $1.
required() {
	local v
	v=$(awk -v m="$1" '$1 != "module" { for (i = 1; i < NF; i++) if ($i == m) { print $(i + 1); exit } }' "$2")
	[[ -n $v ]] || { echo "build.sh: $2 does not require $1" >&2; exit 1; }
	echo "$v"
}
k8s_version=$(required k8s.io/kubernetes "$here/go.mod")
etcd_version=$(required go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")
minor=${k8s_version#v1.}
minor=${minor%%.*}
echo "building kube-apiserver, kube-controller-manager, kube-scheduler and kubectl $k8s_version and etcd $etcd_version into $bin (the first time takes several minutes)" >&2

# Stamp the real version into the binaries so that `kubectl version` and the
# apiserver's /version tell the truth.
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

(cd "$here" && go build -ldflags "$ldflags" -o "$bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
(cd "$here/etcd" && go build -o "$bin/etcd" . && go build -o "$bin/" go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3)
echo "$stamp" >"$bin/.controlplane.stamp"
echo "built $(ls "$bin" | tr '\n' ' ')" >&2
