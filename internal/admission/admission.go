// Package admission installs the admission policies of config/admission,
// which govern the machinist.dev/request annotation like the verbs it
// stands for (kube-apiserver checks the requester's right to the verb and
// stamps their name) and a new Machine's spec.providerID like the verb
// adopt. `machinist run` and the tests install them as
// `kubectl apply --server-side -k config/default` does in a cluster.
package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/machinist-dev/machinist/config"
)

// RequestPolicy names the ValidatingAdmissionPolicy, and its binding, that
// admits a request annotation only from someone allowed the verb and a
// requester annotation only with the requester's own name.
const RequestPolicy = "machinist-request"

// VersionPolicy names the ValidatingAdmissionPolicy, and its binding, that
// lets machinist.dev/version-requested-by hold only the requester's name.
const VersionPolicy = "machinist-version-requester"

// AdoptPolicy names the ValidatingAdmissionPolicy, and its binding, that
// admits a Machine with spec.providerID only from someone allowed the
// verb adopt on machines.
const AdoptPolicy = "machinist-adopt"

// manifests are the files in config that hold the policies and bindings.
var manifests = []string{"admission/request.yaml", "admission/adopt.yaml"}

// Objects decodes the policies and their bindings, in the files' order.
func Objects() ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, manifest := range manifests {
		raw, err := config.Manifests.ReadFile(manifest)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			u := &unstructured.Unstructured{}
			err := dec.Decode(&u.Object)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", manifest, err)
			}
			if len(u.Object) > 0 {
				out = append(out, u)
			}
		}
	}
	return out, nil
}

// Install creates or updates the policies and bindings with server-side
// apply. kube-apiserver enforces them a moment later, once its policy
// informers have seen them.
func Install(ctx context.Context, c client.Client) error {
	objs, err := Objects()
	if err != nil {
		return err
	}
	for _, u := range objs {
		if err := c.Patch(ctx, u, client.Apply, client.FieldOwner("machinist"), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// Vouches reports whether kube-apiserver enforces RequestPolicy: the
// policy exists, and so does its binding, which denies what it refuses. Only then does
// machinist.dev/requested-by name who really set the request; without it,
// anyone who may patch the Machine could have written any name. It reads
// the API, not a cache: it is asked once per request.
func Vouches(ctx context.Context, r client.Reader) (bool, error) {
	return enforced(ctx, r, RequestPolicy)
}

// VouchesForVersion is Vouches for VersionPolicy: only while it is
// enforced does machinist.dev/version-requested-by name who really
// changed the version.
func VouchesForVersion(ctx context.Context, r client.Reader) (bool, error) {
	return enforced(ctx, r, VersionPolicy)
}

// enforced reports whether the validating policy name and its binding of
// the same name exist, and the binding denies what the policy refuses.
func enforced(ctx context.Context, r client.Reader, name string) (bool, error) {
	p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, b); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return b.Spec.PolicyName == name && slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny), nil
}
