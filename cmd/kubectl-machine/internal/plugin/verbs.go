package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subresources "github.com/machinist-dev/machinist/api/subresources/v1alpha1"
	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// verbFlags are the flags of reboot and repair that become the request body.
type verbFlags struct {
	mode    string
	noDrain bool
	reason  string
	grace   int64
	// override asks to pass the disruption budgets by.
	override bool
}

// verb is an operation the verbs server carries out on a Machine, with
// what its command needs: reboot and repair differ only in these.
type verb struct {
	// name is both the subresource and the word a person uses: reboot.
	name string
	// past is the verb done: rebooted.
	past                 string
	short, long, example string
	addFlags             func(*pflag.FlagSet, *verbFlags)
	// body turns the flags into the request body.
	body func(verbFlags) (any, error)
}

var reboot = verb{
	name:  subresources.Reboot,
	past:  "rebooted",
	short: "Reboot a Machine: drain its Node, restart the instance, wait for the Node",
	long: `Reboot a Machine through the Machinist verbs server. By default the Node is
drained first and the operating system restarted (--mode soft); --mode hard
power-cycles the instance and --no-drain skips the drain.

Without --wait the command ends once the request is accepted and prints the
operation ID, which the Machine's status.operation.id then carries. With
--wait it follows the Machine until the operation has Succeeded or Failed.`,
	example: `  # Reboot m1 and wait until its Node is back
  kubectl machine reboot m1 --wait

  # Power-cycle without draining, waiting at most 5 minutes
  kubectl machine reboot m1 --mode hard --no-drain --wait --timeout 5m`,
	addFlags: func(fs *pflag.FlagSet, f *verbFlags) {
		fs.StringVar(&f.mode, "mode", string(subresources.RebootSoft), "soft restarts the operating system, hard power-cycles the instance")
		fs.BoolVar(&f.noDrain, "no-drain", false, "reboot without draining the Node first")
	},
	body: func(f verbFlags) (any, error) {
		mode := subresources.RebootMode(f.mode)
		if mode != subresources.RebootSoft && mode != subresources.RebootHard {
			return nil, fmt.Errorf("--mode must be soft or hard, not %q", f.mode)
		}
		body := &subresources.RebootOptions{TypeMeta: typeMeta("RebootOptions"), Mode: mode, GracePeriodSeconds: gracePeriod(f.grace),
			OverrideDisruptionBudgets: f.override}
		if f.noDrain {
			body.Drain = ptr.To(false)
		}
		return body, nil
	},
}

var repair = verb{
	name:  subresources.Repair,
	past:  "repaired",
	short: "Repair a Machine: drain its Node and re-image the instance",
	long: `Repair (re-image) a Machine through the Machinist verbs server. The Node is
drained first; --no-drain re-images the machine under its pods, which die
with it: the way to repair a Machine whose cluster cannot be reached, where
no pod can be evicted. --reason is recorded with the operation.

Without --wait the command ends once the request is accepted and prints the
operation ID, which the Machine's status.operation.id then carries. With
--wait it follows the Machine until the operation has Succeeded or Failed.`,
	example: `  kubectl machine repair m1 --reason "disk errors in dmesg" --wait

  # Repair a Machine whose workload cluster is down, without a drain
  kubectl machine repair m1 --no-drain`,
	addFlags: func(fs *pflag.FlagSet, f *verbFlags) {
		fs.StringVar(&f.reason, "reason", "", "why the Machine needs repair; recorded with the operation")
		fs.BoolVar(&f.noDrain, "no-drain", false, "repair without draining the Node first")
	},
	body: func(f verbFlags) (any, error) {
		body := &subresources.RepairOptions{TypeMeta: typeMeta("RepairOptions"), Reason: f.reason, GracePeriodSeconds: gracePeriod(f.grace),
			OverrideDisruptionBudgets: f.override}
		if f.noDrain {
			body.Drain = ptr.To(false)
		}
		return body, nil
	},
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: subresources.SchemeGroupVersion.String(), Kind: kind}
}

// gracePeriod follows kubectl: -1 (the default) keeps each pod's own.
func gracePeriod(seconds int64) *int64 {
	if seconds < 0 {
		return nil
	}
	return &seconds
}

func (o *options) verbCommand(v verb) *cobra.Command {
	var (
		flags   verbFlags
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:     v.name + " NAME",
		Short:   v.short,
		Long:    v.long + "\n\n" + exitCodesHelp,
		Example: v.example,
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := machineKind.name(args)
			if err != nil {
				return err
			}
			if flags.grace < -1 {
				return fmt.Errorf("--grace-period must be -1 (each pod's own) or more, not %d", flags.grace)
			}
			body, err := v.body(flags)
			if err != nil {
				return err
			}
			c, err := o.connect()
			if err != nil {
				return err
			}
			return c.runVerb(cmd.Context(), v, name, body, wait, timeout, o.streams.Out)
		},
	}
	v.addFlags(cmd.Flags(), &flags)
	cmd.Flags().Int64Var(&flags.grace, "grace-period", -1, "seconds each pod gets to terminate during the drain; -1 keeps each pod's own")
	cmd.Flags().BoolVar(&flags.override, "override-disruption-budgets", false,
		"start even where a MachineDisruptionBudget refuses it (needs the verb override on machinedisruptionbudgets)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the operation has Succeeded or Failed, printing its progress")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long --wait waits; 0 waits for ever")
	return cmd
}

func (c *cluster) runVerb(ctx context.Context, v verb, name string, body any, wait bool, timeout time.Duration, out io.Writer) error {
	bootID := ""
	if wait {
		// The boot ID before the request, so that progress can show it change.
		m := &machinistv1.Machine{}
		if err := c.client.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: name}, m); err != nil {
			return fmt.Errorf("cannot %s machine %q: %w", v.name, name, err)
		}
		bootID = m.Status.BootID
	}
	op, err := c.request(ctx, v, name, body)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "machine/%s %s accepted (%s)\n", name, v.name, op.ID)
	if !wait {
		return nil
	}
	ctx, cancel := withTimeout(ctx, timeout)
	defer cancel()
	return waitOperation(ctx, c.client, c.namespace, name, v, op.ID, bootID, out)
}

// request sends the verb and returns the operation the server recorded.
func (c *cluster) request(ctx context.Context, v verb, name string, body any) (*subresources.MachineOperation, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(c.config)
	cfg.APIPath = "/apis"
	cfg.GroupVersion = &subresources.SchemeGroupVersion
	cfg.ContentType = runtime.ContentTypeJSON
	// Only to decode the metav1.Status of a refusal; the answer itself is
	// decoded below as plain JSON.
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	// No retries: a 429 from a disruption budget may say to come back in
	// hours, which client-go would otherwise sleep through.
	res := rc.Put().Namespace(c.namespace).Resource(subresources.Machines).Name(name).SubResource(v.name).Body(data).MaxRetries(0).Do(ctx)
	if err := res.Error(); err != nil {
		return nil, v.refusal(name, err)
	}
	raw, _ := res.Raw()
	op := &subresources.MachineOperation{}
	if err := json.Unmarshal(raw, op); err != nil || op.ID == "" {
		return nil, fmt.Errorf("the server accepted the %s of machine %q but its answer names no operation: %q", v.name, name, raw)
	}
	return op, nil
}

// refusal words a refused request for a person, keeping the server's own
// message, which names the reason (such as the operation in flight).
func (v verb) refusal(name string, err error) error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return fmt.Errorf("cannot %s machine %q: %w", v.name, name, err)
	}
	s := status.Status()
	switch s.Code {
	case http.StatusConflict:
		return refused(fmt.Errorf("machine %q cannot be %s now: %s", name, v.past, conflictReason(s.Message, name)))
	case http.StatusForbidden:
		return refused(fmt.Errorf("not allowed to %s machine %q: %s", v.name, name, s.Message))
	case http.StatusTooManyRequests:
		msg := fmt.Sprintf("machine %q cannot be %s now: %s", name, v.past, s.Message)
		if s.Details != nil && s.Details.RetryAfterSeconds > 0 {
			msg += fmt.Sprintf(" (try again in %s)", time.Duration(s.Details.RetryAfterSeconds)*time.Second)
		}
		return refused(errors.New(msg))
	case http.StatusUnprocessableEntity:
		return refused(fmt.Errorf("invalid %s options for machine %q: %s", v.name, name, s.Message))
	case http.StatusNotFound:
		if apierrors.IsUnexpectedServerError(err) {
			// The verbs server answers with a Status; a 404 without one
			// comes from kube-apiserver itself: nothing serves the group.
			return refused(fmt.Errorf("cannot %s machine %q: the API server does not serve %s (is the Machinist verbs server installed and its APIService available?)",
				v.name, name, subresources.SchemeGroupVersion))
		}
		return refused(fmt.Errorf("cannot %s machine %q: %s", v.name, name, s.Message))
	}
	return fmt.Errorf("cannot %s machine %q: %w", v.name, name, err)
}

// conflictReason is a 409's message without the boilerplate apimachinery
// puts before the server's reason ("Operation cannot be fulfilled on
// machines.subresources.machinist.dev "m1": "), which would repeat what
// the plugin already says.
func conflictReason(msg, name string) string {
	const boilerplate = "Operation cannot be fulfilled on "
	if !strings.HasPrefix(msg, boilerplate) {
		return msg
	}
	if _, reason, found := strings.Cut(msg, strconv.Quote(name)+": "); found && reason != "" {
		return reason
	}
	return msg
}
