package plugin

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/machinist-dev/machinist/providers"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

// permanentCodes are the codes that mean "retrying cannot help" when a
// status carries no Failure detail.
var permanentCodes = map[codes.Code]bool{
	codes.InvalidArgument:    true,
	codes.FailedPrecondition: true,
	codes.NotFound:           true,
	codes.AlreadyExists:      true,
	codes.PermissionDenied:   true,
	codes.OutOfRange:         true,
	codes.Unimplemented:      true,
}

// ReasonInstanceTaken is the reason of the Failure a Create is refused
// with when its Machine's spec.providerID names an instance that belongs
// to another Machine: an error wrapping providers.ErrTaken on either side.
const ReasonInstanceTaken = "InstanceTaken"

// toStatus is how a server answers an actuator's error: a permanent one
// as FAILED_PRECONDITION, a transient one as ABORTED (not UNAVAILABLE,
// which the client keeps for a provider it cannot reach), each with a
// Failure detail so that no client has to guess from the code. An
// instance taken by another Machine is permanent whether or not the
// actuator marked it so, for no retry hands it over, and its Failure says
// so in its reason.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	code, permanent, reason := codes.Aborted, providers.IsPermanent(err), ""
	if providers.IsTaken(err) {
		permanent, reason = true, ReasonInstanceTaken
	}
	if permanent {
		code = codes.FailedPrecondition
	}
	st, derr := status.New(code, err.Error()).WithDetails(&providerv1.Failure{Permanent: permanent, Reason: reason})
	if derr != nil {
		return status.Error(code, err.Error())
	}
	return st.Err()
}

// fromStatus turns a call's error into the Actuator contract's: marked
// Permanent, marked Unavailable (the provider did not answer), or left
// transient. A Failure whose reason is ReasonInstanceTaken is permanent
// and wraps providers.ErrTaken.
func fromStatus(name, call string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("provider %s: %s: %w", name, call, err)
	}
	wrapped := fmt.Errorf("provider %s: %s: %s", name, call, st.Message())
	for _, d := range st.Details() {
		if f, ok := d.(*providerv1.Failure); ok {
			if f.GetReason() == ReasonInstanceTaken {
				// Permanent whatever the detail says, as toStatus makes it.
				return providers.Permanent(marked{wrapped, providers.ErrTaken})
			}
			if f.GetPermanent() {
				return providers.Permanent(wrapped)
			}
			return wrapped
		}
	}
	switch {
	case permanentCodes[st.Code()]:
		return providers.Permanent(wrapped)
	case st.Code() == codes.Unavailable:
		return providers.Unavailable(fmt.Errorf("provider %s is unavailable: %s: %s", name, call, st.Message()))
	}
	return wrapped
}

// marked is err, saying what it says (the provider's message already
// says what the sentinel would), that is also the sentinel mark.
type marked struct {
	err  error
	mark error
}

func (e marked) Error() string   { return e.err.Error() }
func (e marked) Unwrap() []error { return []error{e.err, e.mark} }
