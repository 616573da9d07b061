// Package outcome tells, from the error a write to kube-apiserver
// returned, whether the write may have been stored all the same. A reply
// lost on the way back, or a request kube-apiserver timed out while its
// handler went on, looks like a failure to the client although the
// object is, or soon will be, stored; a controller that took it for "never
// happened" would create a second Machine for one slot, or pick a second
// victim for one deletion.
package outcome

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Unknown reports whether a write that failed with err may have been, or
// may still be, stored: no answer came at all (a broken connection, a
// client timeout), or kube-apiserver answered 5xx, which it also does for
// a request it gave up waiting for while the write went on ("may still be
// processing the request"). Any 4xx is a definite no: the request was
// refused before it was stored (invalid, forbidden, a conflict, a 429 from
// API Priority and Fairness, which refuses before handling).
func Unknown(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == 0 || code >= 500
	}
	return true
}
