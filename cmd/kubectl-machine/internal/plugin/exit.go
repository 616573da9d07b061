package plugin

import (
	"errors"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Exit codes of kubectl-machine. Scripts depend on them: never renumber.
const (
	// ExitOK: the command did what was asked.
	ExitOK = 0
	// ExitError: a usage, connection or unexpected error.
	ExitError = 1
	// ExitFailed: the operation ended Failed, or the rollout failed.
	ExitFailed = 2
	// ExitRefused: the server refused the request (403, 404, 409, 422,
	// or 429 from a disruption budget).
	ExitRefused = 3
	// ExitTimeout: --timeout passed before the wait was over.
	ExitTimeout = 4
)

// exitCodesHelp documents the exit codes in every command's long help.
const exitCodesHelp = `Exit codes:
  0  success
  1  error: usage, connection or anything unexpected
  2  the operation ended Failed, or the rollout failed (progress deadline exceeded)
  3  refused by the server: forbidden (403), not found (404), conflict (409), invalid (422)
     or not allowed now by a MachineDisruptionBudget (429, with when to try again)
  4  timed out waiting`

// exitError carries the exit code an error should end the process with.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func failed(err error) error   { return &exitError{code: ExitFailed, err: err} }
func refused(err error) error  { return &exitError{code: ExitRefused, err: err} }
func timedOut(err error) error { return &exitError{code: ExitTimeout, err: err} }

// ExitCode is the process exit code for what a command returned. API
// errors that were not classified where they happened still count as
// refusals when their code is one of the refusal codes, so a Get of a
// missing object exits 3 wherever it happens.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		switch status.Status().Code {
		case http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusUnprocessableEntity, http.StatusTooManyRequests:
			return ExitRefused
		}
	}
	return ExitError
}
