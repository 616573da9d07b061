package providers

import (
	"context"
	"fmt"
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// Helpers for providers whose instances are named after the Machine they
// were made for, as both shipped providers' are.

// ProviderID is <provider>:///<namespace>/<name>/<uid> of m: unique, and
// it names its provider, so a Machine can be deleted after its class.
func ProviderID(provider string, m *machinistv1.Machine) string {
	return provider + ":///" + m.Namespace + "/" + m.Name + "/" + string(m.UID)
}

// ParseProviderID splits a ProviderID of provider into the namespace, name
// and UID of the Machine it was made for.
func ParseProviderID(provider, providerID string) (namespace, name string, uid types.UID, err error) {
	prefix := provider + ":///"
	rest, ok := strings.CutPrefix(providerID, prefix)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", fmt.Errorf("%s: %q is not a %s providerID (%s<namespace>/<name>/<uid>)", provider, providerID, provider, prefix)
	}
	return parts[0], parts[1], types.UID(parts[2]), nil
}

// NodeName makes a Node name unique across namespaces from a Machine's name
// and UID, short enough to be a valid hostname label value too.
func NodeName(machine string, uid types.UID) string {
	suffix := strings.ReplaceAll(string(uid), "-", "")
	suffix = suffix[:min(8, len(suffix))]
	machine = strings.TrimRight(machine[:min(len(machine), 63-1-len(suffix))], "-.")
	return machine + "-" + suffix
}

// ForgetNode deletes a Node and its kubelet Lease with kube, credentials
// that may delete any Node (the conformance suite's, cleaning up after a
// provider). A re-imaged machine does this for itself with its own
// (nodeagent.Forget), so a provider need not. Either being gone already
// is not an error.
func ForgetNode(ctx context.Context, kube kubernetes.Interface, node string) error {
	if err := kube.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting node %s: %w", node, err)
	}
	err := kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, node, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the lease of node %s: %w", node, err)
	}
	return nil
}

// CheckAddress says why a provider's instance address could not be a
// Node's: an IP type whose address is no IP, a DNS or Hostname type whose
// address is no DNS name, or a type Kubernetes does not know. A Node's
// addresses tell kube-apiserver where to reach its kubelet, so nothing
// else is put there.
func CheckAddress(a corev1.NodeAddress) error {
	switch a.Type {
	case corev1.NodeInternalIP, corev1.NodeExternalIP:
		if net.ParseIP(a.Address) == nil {
			return fmt.Errorf("an instance address of type %s must be an IP address, not %q", a.Type, a.Address)
		}
	case corev1.NodeInternalDNS, corev1.NodeExternalDNS, corev1.NodeHostName:
		if errs := validation.IsDNS1123Subdomain(a.Address); len(errs) > 0 {
			return fmt.Errorf("an instance address of type %s must be a DNS name, not %q: %s", a.Type, a.Address, strings.Join(errs, "; "))
		}
	default:
		return fmt.Errorf("an instance address has type %q: want InternalIP, ExternalIP, InternalDNS, ExternalDNS or Hostname", a.Type)
	}
	return nil
}
