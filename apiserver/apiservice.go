package apiserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subresourcesv1 "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
)

// APIServiceName is the name of the APIService that routes the verbs group.
var APIServiceName = subresourcesv1.SchemeGroupVersion.Version + "." + subresourcesv1.GroupName

// APIService routes subresources.machinist.dev/v1alpha1 to the verbs
// server behind service, trusting caBundle for its serving certificate.
//
// Its group priority is below the CRDs' (1000), so that a client that
// resolves a bare "machines" picks machinist.dev, not this group.
func APIService(service types.NamespacedName, port int32, caBundle []byte) *apiregv1.APIService {
	return &apiregv1.APIService{
		TypeMeta:   metav1.TypeMeta{APIVersion: apiregv1.SchemeGroupVersion.String(), Kind: "APIService"},
		ObjectMeta: metav1.ObjectMeta{Name: APIServiceName, Labels: map[string]string{"app.kubernetes.io/name": "machinist"}},
		Spec: apiregv1.APIServiceSpec{
			Group:                subresourcesv1.GroupName,
			Version:              subresourcesv1.SchemeGroupVersion.Version,
			Service:              &apiregv1.ServiceReference{Namespace: service.Namespace, Name: service.Name, Port: &port},
			CABundle:             caBundle,
			GroupPriorityMinimum: 100,
			VersionPriority:      15,
		},
	}
}

// LocalService is a Service for a verbs server running on the same host as
// kube-apiserver: kube-apiserver refuses endpoints on loopback addresses,
// but follows an ExternalName of localhost.
func LocalService(service types.NamespacedName, port int32) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: service.Namespace, Name: service.Name},
		Spec: corev1.ServiceSpec{
			Type:         corev1.ServiceTypeExternalName,
			ExternalName: "localhost",
			Ports:        []corev1.ServicePort{{Name: "https", Port: port, Protocol: corev1.ProtocolTCP}},
		},
	}
}

// ServiceHosts are the names a Service is reached by from kube-apiserver;
// the serving certificate must answer to them.
func ServiceHosts(service types.NamespacedName) []string {
	return []string{
		service.Name + "." + service.Namespace + ".svc",
		service.Name + "." + service.Namespace + ".svc.cluster.local",
	}
}

// ServiceHostsOf is ServiceHosts for "namespace/name"; "" gives none.
func ServiceHostsOf(service string) []string {
	ns, name, ok := strings.Cut(service, "/")
	if !ok || ns == "" || name == "" {
		return nil
	}
	return ServiceHosts(types.NamespacedName{Namespace: ns, Name: name})
}

// SetCABundle writes caBundle into the named APIService, which must exist
// (it is deployed with the server); a server that made its own CA calls it
// at start.
func SetCABundle(ctx context.Context, c client.Client, name string, caBundle []byte) error {
	svc := &apiregv1.APIService{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, svc); err != nil {
		return fmt.Errorf("reading APIService %s to set its caBundle: %w", name, err)
	}
	patch := client.MergeFrom(svc.DeepCopy())
	svc.Spec.CABundle = caBundle
	if err := c.Patch(ctx, svc, patch); err != nil {
		return fmt.Errorf("setting the caBundle of APIService %s: %w", name, err)
	}
	return nil
}

// RegisterLocal registers s, running on this host, with the kube-apiserver
// c talks to: once s can authenticate what the aggregator forwards (the
// aggregator would otherwise meet refusals, which s logs as errors), it
// creates or updates the namespace, the LocalService and the APIService,
// then waits until kube-apiserver reports the APIService Available.
func (s *Server) RegisterLocal(ctx context.Context, c client.Client, service types.NamespacedName, timeout time.Duration) error {
	if err := s.WaitReady(ctx, timeout); err != nil {
		return err
	}
	port, caBundle := int32(s.Port), s.CABundle
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: service.Namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, obj := range []client.Object{LocalService(service, port), APIService(service, port, caBundle)} {
		if err := c.Patch(ctx, obj, client.Apply, client.FieldOwner("machinist"), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
	}
	return WaitAvailable(ctx, c, timeout)
}

// WaitAvailable waits until the verbs APIService is Available.
func WaitAvailable(ctx context.Context, c client.Client, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		svc := &apiregv1.APIService{}
		if err := c.Get(ctx, client.ObjectKey{Name: APIServiceName}, svc); err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range svc.Status.Conditions {
			if cond.Type == apiregv1.Available {
				last = cond.Reason + ": " + cond.Message
				return cond.Status == apiregv1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("APIService %s is not Available (%s): %w", APIServiceName, last, err)
	}
	return nil
}
