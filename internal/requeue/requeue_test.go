package requeue

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestExpected(t *testing.T) {
	gr := schema.GroupResource{Group: "machinist.dev", Resource: "machines"}
	notFound := apierrors.NewNotFound(gr, "m")
	conflict := apierrors.NewConflict(gr, "m", errors.New("the object has been modified"))
	boom := errors.New("boom")
	cases := []struct {
		name      string
		in        reconcile.Result
		err       error
		wantAfter time.Duration
		wantErr   error
	}{
		{"nil", reconcile.Result{RequeueAfter: 5 * time.Second}, nil, 5 * time.Second, nil},
		{"not found", reconcile.Result{}, notFound, After, nil},
		{"wrapped not found", reconcile.Result{}, errors.Join(notFound), After, nil},
		{"conflict", reconcile.Result{}, conflict, After, nil},
		{"conflict keeps a sooner requeue", reconcile.Result{RequeueAfter: 100 * time.Millisecond}, conflict, 100 * time.Millisecond, nil},
		{"conflict shortens a later requeue", reconcile.Result{RequeueAfter: time.Minute}, conflict, After, nil},
		{"conflict and not found", reconcile.Result{}, errors.Join(conflict, notFound), After, nil},
		{"other", reconcile.Result{}, boom, 0, boom},
		{"other joined with not found", reconcile.Result{}, errors.Join(notFound, boom), 0, boom},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Expected(c.in, c.err)
			if res.RequeueAfter != c.wantAfter {
				t.Errorf("RequeueAfter = %s, want %s", res.RequeueAfter, c.wantAfter)
			}
			if (err == nil) != (c.wantErr == nil) || (c.wantErr != nil && !errors.Is(err, c.wantErr)) {
				t.Errorf("err = %v, want %v", err, c.wantErr)
			}
		})
	}
}
