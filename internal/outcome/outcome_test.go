package outcome

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestUnknownTellsAMaybeFromANo(t *testing.T) {
	gr := schema.GroupResource{Group: "machinist.dev", Resource: "machines"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&url.Error{Op: "Post", URL: "https://x", Err: io.ErrUnexpectedEOF}, true},
		{context.DeadlineExceeded, true},
		{apierrors.NewTimeoutError("request did not complete within requested timeout", 0), true},
		{apierrors.NewServiceUnavailable("unavailable"), true},
		{apierrors.NewInternalError(errors.New("etcd")), true},
		{fmt.Errorf("creating: %w", apierrors.NewInternalError(errors.New("x"))), true},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{apierrors.NewConflict(gr, "m", errors.New("changed")), false},
		{apierrors.NewAlreadyExists(gr, "m"), false},
		{apierrors.NewNotFound(gr, "m"), false},
		{apierrors.NewForbidden(gr, "m", errors.New("no")), false},
		{apierrors.NewBadRequest("bad"), false},
	} {
		if got := Unknown(tc.err); got != tc.want {
			t.Errorf("Unknown(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
