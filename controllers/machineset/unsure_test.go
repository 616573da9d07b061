package machineset_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/controllers/machineset"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// A creation whose outcome is unknown is repeated under its name. When the
// batch before its repeat fails, the repeat is not sent; the name must stay
// unsure, since its first attempt may still be stored late. Forgotten, the
// set would fill its slot with a new name and, once the late one landed,
// hold one Machine too many.
func TestAnUnsureNameNotRepeatedStaysUnsure(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "unsure"}}); err != nil {
		t.Fatal(err)
	}
	ms := &machinistv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "unsure", Name: "pool"},
		Spec: machinistv1.MachineSetSpec{
			Replicas: ptr.To(int32(2)),
			Selector: machinistv1.LabelSelector{MatchLabels: map[string]string{"pool": "pool"}},
			Template: testenv.Template("pool", "small", testenv.Version),
		},
	}
	if err := env.Client.Create(ctx, ms); err != nil {
		t.Fatal(err)
	}
	// The first name's create times out: its outcome is unknown.
	lost := func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
		if strings.HasSuffix(o.GetName(), "-first") {
			return apierrors.NewTimeoutError("the reply was lost", 1)
		}
		return c.Create(ctx, o, opts...)
	}
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	c := interceptor.NewClient(direct, interceptor.Funcs{Create: lost})
	r := &machineset.Reconciler{Client: c}
	key := client.ObjectKeyFromObject(ms)
	// An earlier reconcile's create of pool-earlier lost its reply.
	r.CreateUnsure(key, "pool-earlier")

	names := []string{"pool-first", "pool-earlier"}
	if _, err := r.CreateMachines(ctx, ms, names); err == nil {
		t.Fatal("a batch whose create timed out reported no error")
	}
	unsure := r.UnsureCreates(key)
	for _, name := range names {
		if !slices.Contains(unsure, name) {
			t.Errorf("%s is no longer unsure after the batch before its repeat failed (unsure: %v): its slot would be filled twice", name, unsure)
		}
	}
}
