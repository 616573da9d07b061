package move

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/nodes"
)

// A kept token's Secret is carried to the target manager's namespace
// under the copy's UID, and the copy's status records it. Run again (a
// move stopped before the copy's status was written), the carry finds
// its own copy; a Secret of that name it did not make is refused, not
// taken. A record whose Secret is not the one it names goes as it is,
// with a warning, and nothing is copied. One API server plays both
// clusters: the two managers' namespaces differ.
func TestAKeptTokenIsCarriedToTheTargetManager(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	c := env.Client
	for _, ns := range []string{"old-manager", "new-manager"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	o := Options{From: c, To: c, ManagerNamespace: "old-manager", ToManagerNamespace: "new-manager", Out: &out}
	m := &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "fleet", Name: "m", UID: "0a0a0a0a-0000-4000-8000-000000000001"}}
	kept := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "old-manager", Name: nodes.KeptTokenSecretName(m.UID),
			Labels: map[string]string{nodes.TokenMachineLabel: string(m.UID)}},
		Type: nodes.KeptTokenSecretType,
		Data: map[string][]byte{"token": []byte("abcdef.0123456789abcdef")},
	}
	if err := c.Create(ctx, kept); err != nil {
		t.Fatal(err)
	}
	m.Status.KeptToken = &machinistv1.KeptToken{SecretUID: string(kept.UID), TokenID: "abcdef"}
	it := item{kind: "Machine", obj: m, status: true}
	const copyUID = types.UID("0b0b0b0b-0000-4000-8000-000000000002")

	carried, err := carryKeptToken(ctx, o, it, copyUID)
	if err != nil {
		t.Fatal(err)
	}
	copied := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "new-manager", Name: nodes.KeptTokenSecretName(copyUID)}, copied); err != nil {
		t.Fatalf("no copy in the target manager's namespace: %v", err)
	}
	rec := carried.obj.(*machinistv1.Machine).Status.KeptToken
	if rec.SecretUID != string(copied.UID) || rec.TokenID != "abcdef" || copied.Labels[nodes.TokenMachineLabel] != string(copyUID) ||
		string(copied.Data["token"]) != "abcdef.0123456789abcdef" || copied.Type != nodes.KeptTokenSecretType {
		t.Errorf("the copy's record %+v, the copied Secret %s: labels %v, type %s", rec, copied.UID, copied.Labels, copied.Type)
	}
	if m.Status.KeptToken.SecretUID != string(kept.UID) {
		t.Error("the source's Machine was changed")
	}

	// Run again: the same copy.
	again, err := carryKeptToken(ctx, o, it, copyUID)
	if err != nil || again.obj.(*machinistv1.Machine).Status.KeptToken.SecretUID != string(copied.UID) {
		t.Fatalf("carried again: %v, %+v", err, again.obj.(*machinistv1.Machine).Status.KeptToken)
	}

	// A Secret of the copy's name the move did not make.
	const otherUID = types.UID("0c0c0c0c-0000-4000-8000-000000000003")
	planted := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "new-manager", Name: nodes.KeptTokenSecretName(otherUID)}}
	if err := c.Create(ctx, planted); err != nil {
		t.Fatal(err)
	}
	if _, err := carryKeptToken(ctx, o, it, otherUID); err == nil || !strings.Contains(err.Error(), "no copy of this move's") {
		t.Errorf("a Secret the move did not make was taken: %v", err)
	}

	// A record naming another Secret than the one of its name.
	m.Status.KeptToken.SecretUID = "0d0d0d0d-0000-4000-8000-000000000004"
	const lostUID = types.UID("0e0e0e0e-0000-4000-8000-000000000005")
	lost, err := carryKeptToken(ctx, o, it, lostUID)
	if err != nil || lost.obj != it.obj || !strings.Contains(out.String(), "warning: the bootstrap token Machine m records is not in old-manager") {
		t.Errorf("a record of another Secret: %v, output %q", err, out.String())
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "new-manager", Name: nodes.KeptTokenSecretName(lostUID)}, &corev1.Secret{}); err == nil {
		t.Error("a Secret the record does not name was copied")
	}

	// Released: the source's Secret goes, by the UID recorded.
	m.Status.KeptToken.SecretUID = string(kept.UID)
	if err := dropKeptToken(ctx, o, m); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(kept), &corev1.Secret{}); err == nil {
		t.Error("the source's kept Secret is still there")
	}
	if err := dropKeptToken(ctx, o, m); err != nil {
		t.Errorf("dropped again: %v", err)
	}
}
