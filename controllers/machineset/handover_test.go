package machineset_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
)

// uids lists the Machines of ns by UID, owner set and whether deleting.
func uids(ctx context.Context, ns string) map[types.UID]string {
	out := map[types.UID]string{}
	for _, m := range env.Machines(GinkgoTB(), ns) {
		owner := "<none>"
		if ref := metav1.GetControllerOf(&m); ref != nil {
			owner = ref.Name
		}
		if !m.DeletionTimestamp.IsZero() {
			owner += " (deleting)"
		}
		out[m.UID] = owner
	}
	return out
}

// setPatch changes a set's replicas and one annotation in one update.
func setPatch(ctx context.Context, ms *machinistv1.MachineSet, replicas int32, key, value string) {
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ms), ms)).To(Succeed())
	patch := client.MergeFrom(ms.DeepCopy())
	ms.Spec.Replicas = ptr.To(replicas)
	if ms.Annotations == nil {
		ms.Annotations = map[string]string{}
	}
	ms.Annotations[key] = value
	Expect(k8s.Patch(ctx, ms, patch)).To(Succeed())
}

// twoSets makes, in a new namespace, the set "from" of n Machines and the
// empty set "to".
func twoSets(ctx context.Context, n int32) (string, *machinistv1.MachineSet, *machinistv1.MachineSet) {
	GinkgoHelper()
	ns := env.NewNamespace(GinkgoTB(), "machineset", testenv.Small)
	from, to := newSet(ns, "from", n, machinistv1.DeleteOldest), newSet(ns, "to", 0, machinistv1.DeleteOldest)
	Expect(k8s.Create(ctx, from)).To(Succeed())
	Expect(k8s.Create(ctx, to)).To(Succeed())
	return ns, from, to
}

var _ = Describe("Handing a Machine over to another MachineSet", func() {
	It("moves a Machine between sets with no Machine created or deleted at any step", func(ctx SpecContext) {
		ns, from, to := twoSets(ctx, 3)
		moving := waitRunning(ctx, ns, 3)[0]
		before := uids(ctx, ns)
		unchanged := func(what string) {
			GinkgoHelper()
			Consistently(func() int { return len(env.Machines(GinkgoTB(), ns)) }).WithTimeout(2*time.Second).Should(Equal(3), what)
			Expect(names(env.Machines(GinkgoTB(), ns))).To(HaveLen(3))
			for uid := range uids(ctx, ns) {
				Expect(before).To(HaveKey(uid), "%s: a Machine was created", what)
			}
			for uid, owner := range uids(ctx, ns) {
				Expect(owner).NotTo(HaveSuffix("(deleting)"), "%s: Machine %s is being deleted", what, uid)
			}
		}

		// The releasing set lowers its replicas and stops counting the
		// Machine in one update: it neither replaces nor deletes it.
		setPatch(ctx, from, 2, machinistv1.ReleasingAnnotation, moving.Name)
		unchanged("after the releasing set's update")
		// The receiving set raises its replicas and counts the Machine
		// before it owns it: it creates nothing in its place.
		setPatch(ctx, to, 1, machinistv1.ReceivingAnnotation, moving.Name)
		unchanged("after the receiving set's update")

		// The move itself: labels and owner in one update.
		m := &machinistv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(&moving), m)).To(Succeed())
		patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
		m.Labels["pool"] = "to"
		m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(to, machinistv1.GroupVersion.WithKind("MachineSet"))}
		Expect(k8s.Patch(ctx, m, patch)).To(Succeed())
		unchanged("after the move")

		Eventually(func() map[types.UID]string { return uids(ctx, ns) }).Should(HaveKeyWithValue(moving.UID, "to"))
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(to), to)).To(Succeed())
			g.Expect(to.Status.Replicas).To(BeEquivalentTo(1))
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(from), from)).To(Succeed())
			g.Expect(from.Status.Replicas).To(BeEquivalentTo(2))
		}).Should(Succeed())

		// The lists outlive the move harmlessly, and once cleared the sets
		// stand as they are.
		setPatch(ctx, from, 2, machinistv1.ReleasingAnnotation, "")
		setPatch(ctx, to, 1, machinistv1.ReceivingAnnotation, "")
		unchanged("after the lists were cleared")
	})

	It("still replaces a Machine it was to receive that is deleted before it arrives", func(ctx SpecContext) {
		ns, from, to := twoSets(ctx, 2)
		gone := waitRunning(ctx, ns, 2)[0]
		setPatch(ctx, from, 1, machinistv1.ReleasingAnnotation, gone.Name)
		setPatch(ctx, to, 1, machinistv1.ReceivingAnnotation, gone.Name)
		Expect(k8s.Delete(ctx, &gone)).To(Succeed())
		// The receiving set learns of it at its next reconcile; a write
		// to it (as the deployment makes) brings one.
		setPatch(ctx, to, 1, "touched", "yes")
		Eventually(func() map[types.UID]string { return uids(ctx, ns) }).WithTimeout(time.Minute).Should(And(
			HaveLen(2), Not(HaveKey(gone.UID)), ContainElements("from", "to")))
	})
})
