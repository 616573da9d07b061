// Package requeue tells the errors of a reconcile that are part of normal
// life from real failures. controller-runtime logs every error a
// reconcile returns at ERROR with a stack trace; an object deleted under a
// reconcile, or a write that lost a race to a newer version, is neither an
// error nor worth a trace.
package requeue

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// AfterConflict is how soon a reconcile whose write lost a race looks
// again, should the watch event of the newer version not wake it first.
const AfterConflict = time.Second

// Expected returns what a reconcile that ended with err should return: an
// object that is gone (NotFound) needs nothing more, a conflict is tried
// again from the newer version, and any other error is returned as it is,
// for the controller's rate-limited retry and its log. Errors joined with
// errors.Join count as expected only when every one of them is.
func Expected(res reconcile.Result, err error) (reconcile.Result, error) {
	switch {
	case err == nil:
		return res, nil
	case all(err, apierrors.IsNotFound):
		return res, nil
	case all(err, func(e error) bool { return apierrors.IsNotFound(e) || apierrors.IsConflict(e) }):
		if res.RequeueAfter == 0 || res.RequeueAfter > AfterConflict {
			res.RequeueAfter = AfterConflict
		}
		return res, nil
	}
	return res, err
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
