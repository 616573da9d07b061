package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

var clusterKind = kind{singular: "workloadcluster", plural: "workloadclusters", short: "wc"}

func (o *options) kubeconfigCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig CLUSTER",
		Short: "Print the kubeconfig of a WorkloadCluster",
		Long: `Print the kubeconfig the manager uses to reach a WorkloadCluster: the key
the WorkloadCluster names (spec.kubeconfig.key, "value" when unset) of the
Secret it names (spec.kubeconfig.secretName), in its own namespace. It
prints the kubeconfig as it is stored, as 'clusterctl get kubeconfig' does,
ready to be redirected to a file.

Reading it takes get on the WorkloadCluster and get on that Secret: RBAC on
the Secret decides who may see the cluster's credentials. A missing
WorkloadCluster, Secret or key, or a Secret you may not read, exits 3.

` + exitCodesHelp,
		Example: `  kubectl machine kubeconfig prod > prod.kubeconfig
  kubectl --kubeconfig prod.kubeconfig get nodes

  kubectl machine kubeconfig wc/prod -n fleet`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := clusterKind.name(args)
			if err != nil {
				return err
			}
			c, err := o.connect()
			if err != nil {
				return err
			}
			data, err := readKubeconfig(cmd.Context(), c.client, client.ObjectKey{Namespace: c.namespace, Name: name})
			if err != nil {
				return err
			}
			_, err = o.streams.Out.Write(data)
			return err
		},
	}
}

// readKubeconfig returns the kubeconfig the WorkloadCluster at key names.
// Each way it can be missing or withheld gets an error of its own, since
// each has a different fix: a name, a Secret, a key, or a Role.
func readKubeconfig(ctx context.Context, c client.Client, key client.ObjectKey) ([]byte, error) {
	wc := &machinistv1.WorkloadCluster{}
	if err := c.Get(ctx, key, wc); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil, refused(fmt.Errorf("workloadcluster %q not found in namespace %q", key.Name, key.Namespace))
		case apierrors.IsForbidden(err):
			return nil, refused(fmt.Errorf("not allowed to get workloadcluster %q in namespace %q: %s", key.Name, key.Namespace, apiMessage(err)))
		}
		return nil, fmt.Errorf("reading workloadcluster %q: %w", key.Name, err)
	}
	ref := wc.Spec.Kubeconfig
	secretKey := client.ObjectKey{Namespace: key.Namespace, Name: ref.SecretName}
	secret := &corev1.Secret{}
	if err := c.Get(ctx, secretKey, secret); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil, refused(fmt.Errorf("workloadcluster %q names Secret %q in namespace %q for its kubeconfig, and there is no such Secret",
				key.Name, ref.SecretName, key.Namespace))
		case apierrors.IsForbidden(err):
			return nil, refused(fmt.Errorf("not allowed to read Secret %q in namespace %q, which holds the kubeconfig of workloadcluster %q: "+
				"this needs get on secrets in that namespace (a Role may grant it for this Secret alone, with resourceNames: [%s]): %s",
				ref.SecretName, key.Namespace, key.Name, ref.SecretName, apiMessage(err)))
		}
		return nil, fmt.Errorf("reading Secret %q of workloadcluster %q: %w", ref.SecretName, key.Name, err)
	}
	data, ok := secret.Data[ref.DataKey()]
	if !ok {
		return nil, refused(fmt.Errorf("there is no key %q in Secret %q in namespace %q, where workloadcluster %q reads its kubeconfig; its keys are: %s",
			ref.DataKey(), ref.SecretName, key.Namespace, key.Name, keysOf(secret)))
	}
	if len(data) == 0 {
		return nil, refused(fmt.Errorf("the key %q of Secret %q in namespace %q, where workloadcluster %q reads its kubeconfig, is empty",
			ref.DataKey(), ref.SecretName, key.Namespace, key.Name))
	}
	return data, nil
}

// apiMessage is the server's own words of an API error, which name the
// user and the verb RBAC refused.
func apiMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		return status.Status().Message
	}
	return err.Error()
}

// keysOf lists a Secret's data keys, never their values, for an error
// that must say which key was meant.
func keysOf(s *corev1.Secret) string {
	if len(s.Data) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(s.Data))
	for k := range s.Data {
		keys = append(keys, fmt.Sprintf("%q", k))
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}
