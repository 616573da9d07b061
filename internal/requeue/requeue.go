// Package requeue tells the errors of a reconcile that are part of normal
// life from real failures. controller-runtime logs every error a
// reconcile returns at ERROR with a stack trace; an object deleted under a
// reconcile, or a write that lost a race to a newer version, is neither an
// error nor worth a trace, but is still worth another look.
package requeue

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// After is how soon a reconcile that ended in normal life looks again.
// After a conflict, the newer version's watch event may never come (the
// controllers drop their own status writes); after a NotFound, the next
// look finds the reconciled object gone and ends there, or, if something
// else was missing, tries again.
const After = time.Second

// Expected returns what a reconcile that ended with err should return.
// NotFound (an object deleted under the reconcile) and Conflict (a write
// that lost a race to a newer version) are normal life: they are not
// returned as errors, which controller-runtime would log at ERROR with a
// stack trace, but looked at again After. Any other error is returned as
// it is, for the controller's rate-limited retry and its log. Errors
// joined with errors.Join are expected only when every one of them is.
func Expected(res reconcile.Result, err error) (reconcile.Result, error) {
	if err == nil {
		return res, nil
	}
	if !all(err, func(e error) bool { return apierrors.IsNotFound(e) || apierrors.IsConflict(e) }) {
		return res, err
	}
	if res.RequeueAfter == 0 || res.RequeueAfter > After {
		res.RequeueAfter = After
	}
	return res, nil
}

// all reports whether ok holds for err, or for every error err joins.
func all(err error, ok func(error) bool) bool {
	if j, isJoin := err.(interface{ Unwrap() []error }); isJoin {
		for _, e := range j.Unwrap() {
			if e != nil && !all(e, ok) {
				return false
			}
		}
		return true
	}
	return ok(err)
}
