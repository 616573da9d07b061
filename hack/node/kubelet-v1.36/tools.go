//go:build tools

// Package kubelet pins the kubelet of the previous minor.
package kubelet

import _ "k8s.io/kubernetes/cmd/kubelet"
