//go:build tools

package main

// etcd's own client and its offline utility, pinned with the server: a
// test snapshots a management cluster with etcdctl and restores it with
// etcdutl, as an operator does.
import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
)
