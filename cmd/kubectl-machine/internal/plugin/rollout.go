package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
)

// machinistv1.ChangeCauseAnnotation is kubectl's: the command that made a revision.

// deploymentResource is the resource of MachineDeployments, for errors about them.
var deploymentResource = machinistv1.GroupVersion.WithResource("machinedeployments").GroupResource()

const deploymentArgs = "md/NAME"

func (o *options) rolloutCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout SUBCOMMAND",
		Short: "Manage the rollout of a MachineDeployment",
		Long: `Manage the rollout of a MachineDeployment, as 'kubectl rollout' does for a
Deployment. The MachineDeployment may be named md/NAME,
machinedeployment/NAME, machinedeployment.machinist.dev/NAME, or plain NAME.

` + exitCodesHelp,
		Example: `  kubectl machine rollout status md/workers
  kubectl machine rollout history md/workers
  kubectl machine rollout undo md/workers --to-revision 2`,
	}
	cmd.AddCommand(o.rolloutStatusCommand(), o.rolloutHistoryCommand(), o.rolloutUndoCommand(),
		o.rolloutPauseCommand(true), o.rolloutPauseCommand(false))
	return cmd
}

// getDeployment connects and reads the MachineDeployment args name.
func (o *options) getDeployment(ctx context.Context, args []string) (*cluster, *machinistv1.MachineDeployment, error) {
	name, err := deploymentKind.name(args)
	if err != nil {
		return nil, nil, err
	}
	c, err := o.connect()
	if err != nil {
		return nil, nil, err
	}
	md := &machinistv1.MachineDeployment{}
	if err := c.client.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: name}, md); err != nil {
		return nil, nil, err
	}
	return c, md, nil
}

func (o *options) rolloutStatusCommand() *cobra.Command {
	var (
		watch   bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status " + deploymentArgs,
		Short: "Wait until a MachineDeployment's rollout is complete",
		Long: `Show the status of a MachineDeployment's rollout and, unless --watch=false,
wait until it is complete: the controller has seen the latest spec, every
Machine is of the current template, the old Machines are gone, and the new
ones are available.

A rollout that exceeded its progress deadline fails (exit code 2). A paused
rollout does not finish; as kubectl does for Deployments, status keeps
waiting (until --timeout, exit code 4) so that a resume from elsewhere lets
it end, but it says that the rollout is paused. With --watch=false the status
is printed once and, as kubectl does, the exit code is 0 whether or not the
rollout is complete, unless it failed.

` + exitCodesHelp,
		Example: `  kubectl machine rollout status md/workers --timeout 15m`,
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := deploymentKind.name(args)
			if err != nil {
				return err
			}
			c, err := o.connect()
			if err != nil {
				return err
			}
			ctx, cancel := withTimeout(cmd.Context(), timeout)
			defer cancel()
			return followRollout(ctx, c.client, c.namespace, name, watch, o.streams.Out)
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", true, "wait until the rollout is complete; false prints the status once")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait; 0 waits for ever")
	return cmd
}

// followRollout prints the rollout's status whenever it changes, until the
// rollout is complete or, without watch, once.
func followRollout(ctx context.Context, c client.WithWatch, ns, name string, watch bool, out io.Writer) error {
	last := ""
	err := follow(ctx, c, deploymentResource, ns, name, &machinistv1.MachineDeployment{},
		func() client.ObjectList { return &machinistv1.MachineDeploymentList{} },
		func(md *machinistv1.MachineDeployment) (bool, error) {
			msg, done, err := rolloutStatus(md)
			if err != nil {
				return false, err
			}
			if msg != last {
				fmt.Fprintln(out, msg)
				last = msg
			}
			return done || !watch, nil
		})
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return timedOut(fmt.Errorf("timed out waiting for the rollout of machinedeployment %q to finish", name))
	case errors.Is(err, errDeleted):
		return fmt.Errorf("machinedeployment %q was deleted while waiting for its rollout", name)
	}
	return err
}

// rolloutStatus says how far md's rollout has come, in kubectl's words for
// Deployments, and whether it is complete; a rollout past its progress
// deadline is an error.
func rolloutStatus(md *machinistv1.MachineDeployment) (string, bool, error) {
	if md.Generation > md.Status.ObservedGeneration {
		return "Waiting for machinedeployment spec update to be observed...", false, nil
	}
	if c := meta.FindStatusCondition(md.Status.Conditions, machinistv1.ConditionProgressing); c != nil && c.Reason == machinistv1.ReasonProgressDeadlineExceeded {
		return "", false, failed(fmt.Errorf("machinedeployment %q exceeded its progress deadline: %s", md.Name, c.Message))
	}
	st, replicas := md.Status, ptr.Deref(md.Spec.Replicas, 1)
	var waiting string
	switch {
	case st.UpdatedReplicas < replicas:
		waiting = fmt.Sprintf("%d out of %d new machines have been updated...", st.UpdatedReplicas, replicas)
	case st.Replicas > st.UpdatedReplicas:
		waiting = fmt.Sprintf("%d old machines are pending termination...", st.Replicas-st.UpdatedReplicas)
	case st.UpdatedReplicas > replicas:
		// Stricter than kubectl, which calls a scale-down in progress
		// complete: the controller does not until it is done.
		waiting = fmt.Sprintf("%d surplus machines are pending termination...", st.UpdatedReplicas-replicas)
	case st.AvailableReplicas < st.UpdatedReplicas:
		waiting = fmt.Sprintf("%d of %d updated machines are available...", st.AvailableReplicas, st.UpdatedReplicas)
	default:
		return fmt.Sprintf("machinedeployment %q successfully rolled out", md.Name), true, nil
	}
	if md.Spec.Paused {
		waiting += fmt.Sprintf(" (the rollout is paused: 'kubectl machine rollout resume md/%s' lets it finish)", md.Name)
	}
	if c := meta.FindStatusCondition(md.Status.Conditions, machinistv1.ConditionProgressing); c != nil && c.Reason == machinistv1.ReasonDisruptionHeld {
		waiting += fmt.Sprintf(" (held by a disruption budget: %s)", c.Message)
	}
	return fmt.Sprintf("Waiting for machinedeployment %q rollout to finish: %s", md.Name, waiting), false, nil
}

func (o *options) rolloutHistoryCommand() *cobra.Command {
	var rev int64
	cmd := &cobra.Command{
		Use:   "history " + deploymentArgs,
		Short: "List a MachineDeployment's revisions, or show one",
		Long: `List the revisions of a MachineDeployment: one per MachineSet it keeps, with
the kubernetes.io/change-cause annotation of the set. --revision N prints the
Machine template of revision N, as 'rollout undo --to-revision N' would
restore it.

` + exitCodesHelp,
		Example: `  kubectl machine rollout history md/workers
  kubectl machine rollout history md/workers --revision 3`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, md, err := o.getDeployment(cmd.Context(), args)
			if err != nil {
				return err
			}
			sets, err := ownedSets(cmd.Context(), c.client, md)
			if err != nil {
				return err
			}
			return printHistory(o.streams.Out, md, sets, rev)
		},
	}
	cmd.Flags().Int64Var(&rev, "revision", 0, "show the template of this revision")
	return cmd
}

func printHistory(w io.Writer, md *machinistv1.MachineDeployment, sets []revisionSet, rev int64) error {
	if rev > 0 {
		i := slices.IndexFunc(sets, func(s revisionSet) bool { return s.revision == rev })
		if i < 0 {
			return fmt.Errorf("unable to find the specified revision %d", rev)
		}
		data, err := yaml.Marshal(templateOf(sets[i].set))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s with revision #%d\nMachine Template:\n%s", deploymentKind.qualified(md.Name), rev, indent(string(data), "  "))
		return err
	}
	fmt.Fprintln(w, deploymentKind.qualified(md.Name))
	if len(sets) == 0 {
		_, err := fmt.Fprintln(w, "No rollout history found.")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "REVISION\tCHANGE-CAUSE")
	for _, s := range sets {
		fmt.Fprintf(tw, "%d\t%s\n", s.revision, orNone(s.set.Annotations[machinistv1.ChangeCauseAnnotation]))
	}
	return tw.Flush()
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

func (o *options) rolloutUndoCommand() *cobra.Command {
	var to int64
	cmd := &cobra.Command{
		Use:   "undo " + deploymentArgs,
		Short: "Roll a MachineDeployment back to an earlier revision",
		Long: `Roll a MachineDeployment back to an earlier revision: its template becomes
that revision's again, and the controller scales that revision's MachineSet
back up, which then becomes the newest revision. --to-revision 0 (the
default) means the revision before the current one. A paused
MachineDeployment cannot be rolled back; resume it first.

` + exitCodesHelp,
		Example: `  kubectl machine rollout undo md/workers
  kubectl machine rollout undo md/workers --to-revision 2`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := deploymentKind.name(args)
			if err != nil {
				return err
			}
			c, err := o.connect()
			if err != nil {
				return err
			}
			result, err := undo(cmd.Context(), c.client, c.namespace, name, to)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(o.streams.Out, "%s %s\n", deploymentKind.qualified(name), result)
			return err
		},
	}
	cmd.Flags().Int64Var(&to, "to-revision", 0, "the revision to roll back to; 0 is the previous one")
	return cmd
}

// undo sets MachineDeployment name's template to that of revision to (0:
// the previous one) and says what it did. It writes with the read object's
// resource version, so that a change made meanwhile is never overwritten:
// on a conflict it reads again and decides again.
func undo(ctx context.Context, c client.Client, ns, name string, to int64) (string, error) {
	if to < 0 {
		return "", fmt.Errorf("--to-revision must not be negative, not %d", to)
	}
	var result string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		md := &machinistv1.MachineDeployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, md); err != nil {
			return err
		}
		if md.Spec.Paused {
			return fmt.Errorf("you cannot roll back a paused machinedeployment; resume it first with 'kubectl machine rollout resume md/%s' and try again", name)
		}
		sets, err := ownedSets(ctx, c, md)
		if err != nil {
			return err
		}
		target, err := rollbackTarget(md, sets, to)
		if err != nil {
			return err
		}
		template := templateOf(target.set)
		if equality.Semantic.DeepEqual(template, md.Spec.Template) {
			result = fmt.Sprintf("skipped rollback (current template already matches revision %d)", target.revision)
			return nil
		}
		md.Spec.Template = template
		// As kubectl does for a Deployment: the change-cause of the
		// revision rolled back to becomes the deployment's again.
		if cause, ok := target.set.Annotations[machinistv1.ChangeCauseAnnotation]; ok {
			if md.Annotations == nil {
				md.Annotations = map[string]string{}
			}
			md.Annotations[machinistv1.ChangeCauseAnnotation] = cause
		} else {
			delete(md.Annotations, machinistv1.ChangeCauseAnnotation)
		}
		if err := c.Update(ctx, md); err != nil {
			return err
		}
		result = "rolled back"
		return nil
	})
	return result, err
}

// rollbackTarget picks the set of revision to, or with to 0 the set of the
// revision before the newest, as kubectl does.
func rollbackTarget(md *machinistv1.MachineDeployment, sets []revisionSet, to int64) (revisionSet, error) {
	if to == 0 {
		if len(sets) < 2 {
			return revisionSet{}, fmt.Errorf("no rollout history found for machinedeployment %q: there is no earlier revision", md.Name)
		}
		return sets[len(sets)-2], nil
	}
	i := slices.IndexFunc(sets, func(s revisionSet) bool { return s.revision == to })
	if i < 0 {
		return revisionSet{}, fmt.Errorf("unable to find specified revision %d in history", to)
	}
	return sets[i], nil
}

// templateOf is the MachineDeployment template a set was made from: its
// own without the template hash label the controller adds, so that the
// controller hashes it to the same set again.
func templateOf(ms *machinistv1.MachineSet) machinistv1.MachineTemplateSpec {
	t := *ms.Spec.Template.DeepCopy()
	delete(t.Metadata.Labels, machinistv1.TemplateHashLabel)
	if len(t.Metadata.Labels) == 0 {
		t.Metadata.Labels = nil
	}
	return t
}

// revisionSet is a MachineSet of a MachineDeployment and its revision.
type revisionSet struct {
	set      *machinistv1.MachineSet
	revision int64
}

// ownedSets are md's MachineSets that carry a revision, oldest first.
func ownedSets(ctx context.Context, c client.Client, md *machinistv1.MachineDeployment) ([]revisionSet, error) {
	var list machinistv1.MachineSetList
	if err := c.List(ctx, &list, client.InNamespace(md.Namespace)); err != nil {
		return nil, err
	}
	var out []revisionSet
	for i := range list.Items {
		ms := &list.Items[i]
		ref := metav1.GetControllerOf(ms)
		if ref == nil || ref.UID != md.UID {
			continue
		}
		rev, err := strconv.ParseInt(ms.Annotations[machinistv1.RevisionAnnotation], 10, 64)
		if err != nil || rev <= 0 {
			continue // not yet numbered by the controller: not a revision
		}
		out = append(out, revisionSet{set: ms, revision: rev})
	}
	slices.SortFunc(out, func(a, b revisionSet) int { return int(a.revision - b.revision) })
	return out, nil
}

func (o *options) rolloutPauseCommand(pause bool) *cobra.Command {
	verb, done := "resume", "resumed"
	short := "Resume a paused MachineDeployment's rollout"
	long := `Resume a paused MachineDeployment: its rollout goes on from where it stopped.`
	if pause {
		verb, done = "pause", "paused"
		short = "Pause a MachineDeployment's rollout"
		long = `Pause a MachineDeployment: the controller stops replacing Machines (it
still scales) until the rollout is resumed, so that several template changes
can be made and rolled out as one.`
	}
	return &cobra.Command{
		Use:     verb + " " + deploymentArgs,
		Short:   short,
		Long:    long + "\n\n" + exitCodesHelp,
		Example: "  kubectl machine rollout " + verb + " md/workers",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, md, err := o.getDeployment(cmd.Context(), args)
			if err != nil {
				return err
			}
			// As kubectl, an object already so is not an error: scripts
			// may pause or resume without looking first.
			if md.Spec.Paused == pause {
				_, err := fmt.Fprintf(o.streams.Out, "%s already %s\n", deploymentKind.qualified(md.Name), done)
				return err
			}
			patch := client.MergeFrom(md.DeepCopy())
			md.Spec.Paused = pause
			if err := c.client.Patch(cmd.Context(), md, patch); err != nil {
				return err
			}
			_, err = fmt.Fprintf(o.streams.Out, "%s %s\n", deploymentKind.qualified(md.Name), done)
			return err
		},
	}
}
