package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

func (o *options) statusCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a Machine's phase, Node, conditions, operation, remediation and last transition",
		Long: `Show a Machine's phase, Node, provider ID and boot ID, a summary of its
conditions, a request annotation not yet taken, its operation (the verb in
progress or the last one finished, and who asked for it),
where it stands on its MachineHealthCheck's remediation ladder, if one
ever judged it unhealthy, and the lifecycle's last transition. -o json or
-o yaml prints the whole Machine instead.

` + exitCodesHelp,
		Example: `  kubectl machine status m1
  kubectl machine status machine/m1 -o yaml`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := machineKind.name(args)
			if err != nil {
				return err
			}
			if output != "" && output != "json" && output != "yaml" {
				return fmt.Errorf("--output must be json or yaml, not %q", output)
			}
			c, err := o.connect()
			if err != nil {
				return err
			}
			m := &machinistv1.Machine{}
			if err := c.client.Get(cmd.Context(), client.ObjectKey{Namespace: c.namespace, Name: name}, m); err != nil {
				return err
			}
			// The client drops the type of typed objects; a printed
			// object should say what it is.
			m.APIVersion, m.Kind = machinistv1.GroupVersion.String(), "Machine"
			// As kubectl without --show-managed-fields: noise to a person.
			m.ManagedFields = nil
			switch output {
			case "json":
				data, err := json.MarshalIndent(m, "", "    ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(o.streams.Out, "%s\n", data)
				return err
			case "yaml":
				data, err := yaml.Marshal(m)
				if err != nil {
					return err
				}
				_, err = o.streams.Out.Write(data)
				return err
			}
			return describeMachine(o.streams.Out, m, time.Now())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml: print the Machine instead of a summary")
	return cmd
}

// describeMachine prints the summary of a Machine that status shows.
func describeMachine(w io.Writer, m *machinistv1.Machine, now time.Time) error {
	st := m.Status
	tw := newTable(w)
	field(tw, "Name", m.Name)
	field(tw, "Namespace", m.Namespace)
	field(tw, "Phase", orNone(string(st.Phase)))
	field(tw, "Version", orNone(m.Spec.Version))
	node := "<none>"
	if st.NodeRef != nil {
		node = st.NodeRef.Name
	}
	field(tw, "Node", node)
	field(tw, "Provider ID", orNone(st.ProviderID))
	field(tw, "Boot ID", orNone(st.BootID))
	if failure := strings.Join(nonEmpty(st.Failure()), ": "); failure != "" {
		field(tw, "Failure", failure)
	}
	if w := waitingFor(m); w != "" {
		field(tw, "Waiting for", w)
	}
	if t := st.LastTransition; t != nil {
		field(tw, "Last transition", fmt.Sprintf("%s -> %s (%s) %s", t.From, t.To, t.Event, when(&t.Time, now)))
	} else {
		field(tw, "Last transition", "<none>")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(st.Conditions) == 0 {
		fmt.Fprintln(w, "Conditions:  <none>")
	} else {
		fmt.Fprintln(w, "Conditions:")
		tw = newTable(w)
		fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
		for _, c := range st.Conditions {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, duration.HumanDuration(now.Sub(c.LastTransitionTime.Time)), c.Message)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if err := describeRequest(w, m); err != nil {
		return err
	}
	if err := describeOperation(w, st.Operation, now); err != nil {
		return err
	}
	return describeRemediation(w, st.Remediation, now)
}

// waitingFor says what a Machine on its way out of service (Draining or
// Deleting) waits for, from its Ready condition, which every such wait
// sets: the drain's group and pods, the volumes, the hooks, the Node.
func waitingFor(m *machinistv1.Machine) string {
	if m.Status.Phase != machinistv1.MachineDraining && m.Status.Phase != machinistv1.MachineDeleting {
		return ""
	}
	c := meta.FindStatusCondition(m.Status.Conditions, machinistv1.ConditionReady)
	if c == nil || c.Status == metav1.ConditionTrue {
		return ""
	}
	return fmt.Sprintf("%s: %s", c.Reason, c.Message)
}

// describeRequest prints a request annotation the controller has not
// taken yet, and who made it: once taken, the operation says so.
func describeRequest(w io.Writer, m *machinistv1.Machine) error {
	verb, ok := m.Annotations[machinistv1.RequestAnnotation]
	if !ok {
		return nil
	}
	tw := newTable(w)
	field(tw, "Request", fmt.Sprintf("%s, requested by %s (annotation %s, not taken yet)",
		strconv.Quote(verb), orNone(m.Annotations[machinistv1.RequestedByAnnotation]), machinistv1.RequestAnnotation))
	return tw.Flush()
}

func describeOperation(w io.Writer, op *machinistv1.Operation, now time.Time) error {
	if op == nil {
		_, err := fmt.Fprintln(w, "Operation:  <none>")
		return err
	}
	fmt.Fprintln(w, "Operation:")
	tw := newTable(w)
	field(tw, "  Type", string(op.Type))
	field(tw, "  ID", op.ID)
	field(tw, "  State", string(op.State))
	field(tw, "  Requested by", orNone(op.RequestedBy))
	field(tw, "  Source", orNone(string(op.Source)))
	field(tw, "  Requested at", when(op.RequestedAt, now))
	field(tw, "  Started", when(op.StartedAt, now))
	field(tw, "  Completed", when(op.CompletedAt, now))
	// The boot the operation must see replaced before it is done.
	field(tw, "  Boot ID at request", orNone(op.BootID))
	if op.FromVersion != "" || op.ToVersion != "" {
		field(tw, "  Version", fmt.Sprintf("%s -> %s", orNone(op.FromVersion), orNone(op.ToVersion)))
	}
	field(tw, "  Message", orNone(op.Message))
	field(tw, "  Options", operationOptions(op.Options))
	return tw.Flush()
}

// describeRemediation prints where the Machine stands on its health
// check's ladder; nothing for a Machine no health check has judged
// unhealthy.
func describeRemediation(w io.Writer, rem *machinistv1.MachineRemediation, now time.Time) error {
	if rem == nil {
		return nil
	}
	fmt.Fprintln(w, "Remediation:")
	tw := newTable(w)
	field(tw, "  Health check", rem.HealthCheck)
	field(tw, "  Phase", string(rem.Phase))
	// The stored rung is an index; people count rungs from 1, as the
	// health check's Events and messages do. Before a rung starts there
	// is no action, and the index means nothing.
	rung := "<none>"
	if rem.Action != "" {
		rung = fmt.Sprintf("%d (%s)", rem.Rung+1, rem.Action)
	}
	field(tw, "  Rung", rung)
	field(tw, "  Operation ID", orNone(rem.OperationID))
	field(tw, "  Unhealthy since", when(rem.UnhealthySince, now))
	field(tw, "  Rung started", when(rem.RungStartedAt, now))
	field(tw, "  Recovered at", when(rem.RecoveredAt, now))
	field(tw, "  Message", orNone(rem.Message))
	return tw.Flush()
}

// newTable aligns columns as kubectl does.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0) }

func field(tw io.Writer, label, value string) { fmt.Fprintf(tw, "%s:\t%s\n", label, value) }

func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// when is an absolute time (people compare it with logs) and how long ago.
func when(t *metav1.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "<none>"
	}
	return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), duration.HumanDuration(now.Sub(t.Time)))
}

func operationOptions(o *machinistv1.OperationOptions) string {
	if o == nil {
		return "<none>"
	}
	var parts []string
	if o.Mode != "" {
		parts = append(parts, "mode="+string(o.Mode))
	}
	if o.SkipDrain != nil {
		parts = append(parts, "skipDrain="+strconv.FormatBool(*o.SkipDrain))
	}
	if o.GracePeriodSeconds != nil {
		parts = append(parts, "gracePeriodSeconds="+strconv.FormatInt(*o.GracePeriodSeconds, 10))
	}
	if o.TimeoutSeconds != nil {
		parts = append(parts, "timeoutSeconds="+strconv.FormatInt(*o.TimeoutSeconds, 10))
	}
	if o.Reason != "" {
		parts = append(parts, "reason="+strconv.Quote(o.Reason))
	}
	if len(parts) == 0 {
		return "<none>"
	}
	return strings.Join(parts, " ")
}
