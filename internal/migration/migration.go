// Package migration rewrites the stored objects of a group's custom
// resources at each one's storage version, and then lets the CRD's
// status.storedVersions list that version alone: what must happen after
// a new version becomes the storage version and before an old one can
// ever stop being served (docs/api.md, "Storage migration").
//
// It asks kube-apiserver's StorageVersionMigration API
// (storagemigration.k8s.io/v1, served by default from Kubernetes 1.37),
// which kube-controller-manager's storage-version-migrator-controller
// carries out and which sets storedVersions itself. Where that API is not
// served, or when asked to, it does what that controller does, with its
// own client: every object read and written back unchanged, which stores
// it at the storage version, and then storedVersions set.
package migration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Group is Machinist's API group, the default of Options.Group.
const Group = "machinist.dev"

// FieldManager names Run's own writes: the objects it writes back and the
// storedVersions it sets.
const FieldManager = "machinist-migration"

// Options configure Run.
type Options struct {
	// Group is the API group whose CRDs are migrated; empty means Group.
	Group string
	// ByClient rewrites the objects with Run's own client even where the
	// StorageVersionMigration API is served.
	ByClient bool
	// Poll is how often a migration's progress is read; zero means 1s.
	Poll time.Duration
	// Log, when set, is told of each step as it happens.
	Log func(format string, args ...any)
}

// Result is what Run did for one CRD.
type Result struct {
	// CRD is the CustomResourceDefinition's name, such as
	// machines.machinist.dev.
	CRD string
	// Before is its status.storedVersions as Run found it.
	Before []string
	// Storage is its storage version, the one storedVersions lists alone
	// after a migration.
	Storage string
	// Migration names the StorageVersionMigration that rewrote its
	// objects; empty when Run's own client did (Rewritten counts them) or
	// when nothing needed doing.
	Migration string
	// Rewritten is how many objects Run's own client wrote back.
	Rewritten int
}

// Needed says whether the CRD still has objects that may be stored at
// another version than its storage version.
func (r Result) Needed() bool { return !slices.Equal(r.Before, []string{r.Storage}) }

// Run migrates every CRD of the group whose storedVersions lists another
// version than its storage version, and returns what it did for each CRD
// of the group, in name order. Through StorageVersionMigrations it asks
// for every CRD's at once and waits for them together: kube-controller-
// manager starts each only once its cache of that resource has caught up
// with the migration, which on a quiet resource takes up to about a
// minute, and one CRD after the other would add those minutes up. Its
// own client migrates one CRD after the other. Either way a CRD it cannot
// migrate is reported and what was done stays done: run again, it leaves
// the CRDs already migrated alone and migrates each other one from its
// start.
func Run(ctx context.Context, cfg *rest.Config, opts Options) ([]Result, error) {
	if opts.Group == "" {
		opts.Group = Group
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		// One poll a second for each of several migrations at once is
		// more than client-go's default 5 requests a second, which would
		// hold the polls back and say so on standard error.
		cfg = rest.CopyConfig(cfg)
		cfg.QPS, cfg.Burst = 50, 100
	}
	ext, err := apiextensions.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	crds, err := ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing CustomResourceDefinitions: %w", err)
	}
	byClient := opts.ByClient
	if !byClient {
		if byClient, err = unserved(kube); err != nil {
			return nil, err
		}
		if byClient {
			opts.Log("this cluster does not serve %s: rewriting the objects with this client", svmv1.SchemeGroupVersion)
		}
	}
	m := &migrator{opts: opts, ext: ext, kube: kube, dyn: dyn}
	var out []Result
	var ours []*apiextensionsv1.CustomResourceDefinition // out[i] is ours[i]'s
	items := crds.Items
	slices.SortFunc(items, func(a, b apiextensionsv1.CustomResourceDefinition) int { return cmp.Compare(a.Name, b.Name) })
	for i := range items {
		crd := &items[i]
		if crd.Spec.Group != opts.Group {
			continue
		}
		res := Result{CRD: crd.Name, Before: slices.Clone(crd.Status.StoredVersions), Storage: storage(crd)}
		if res.Storage == "" {
			return nil, fmt.Errorf("%s has no storage version", crd.Name)
		}
		out, ours = append(out, res), append(ours, crd)
	}
	errs := make([]error, len(out))
	var wg sync.WaitGroup
	for i, crd := range ours {
		res := &out[i]
		if !res.Needed() {
			continue
		}
		opts.Log("%s: stored as %v, migrating to %s", crd.Name, res.Before, res.Storage)
		if byClient {
			errs[i] = m.byClient(ctx, crd, res)
		} else if wait, err := m.byMigration(ctx, crd, res); err != nil {
			errs[i] = err
		} else {
			wg.Go(func() { errs[i] = wait() })
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("%s: %w", out[i].CRD, err)
		}
	}
	return out, errors.Join(errs...)
}

// unserved says whether the StorageVersionMigration API is missing.
func unserved(kube kubernetes.Interface) (bool, error) {
	_, err := kube.Discovery().ServerResourcesForGroupVersion(svmv1.SchemeGroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("asking whether %s is served: %w", svmv1.SchemeGroupVersion, err)
	}
	return false, nil
}

func storage(crd *apiextensionsv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return ""
}

type migrator struct {
	opts Options
	ext  apiextensions.Interface
	kube kubernetes.Interface
	dyn  dynamic.Interface
}

// byMigration asks for a StorageVersionMigration of the CRD's resource
// and returns how to wait until it has succeeded and storedVersions lists
// the storage version alone.
func (m *migrator) byMigration(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, res *Result) (func() error, error) {
	svm := &svmv1.StorageVersionMigration{
		ObjectMeta: metav1.ObjectMeta{GenerateName: crd.Name + "-"},
		Spec:       svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}},
	}
	made, err := m.kube.StoragemigrationV1().StorageVersionMigrations().Create(ctx, svm, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("asking for a StorageVersionMigration: %w", err)
	}
	res.Migration = made.Name
	m.opts.Log("%s: StorageVersionMigration %s asked for", crd.Name, made.Name)
	return func() error {
		err := wait.PollUntilContextCancel(ctx, m.opts.Poll, true, func(ctx context.Context) (bool, error) {
			got, err := m.kube.StoragemigrationV1().StorageVersionMigrations().Get(ctx, made.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil // asked again at the next poll
			}
			if c := meta.FindStatusCondition(got.Status.Conditions, string(svmv1.MigrationFailed)); c != nil && c.Status == metav1.ConditionTrue {
				return false, fmt.Errorf("StorageVersionMigration %s failed: %s: %s", made.Name, c.Reason, c.Message)
			}
			return meta.IsStatusConditionTrue(got.Status.Conditions, string(svmv1.MigrationSucceeded)), nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("StorageVersionMigration %s has not succeeded (is kube-controller-manager's storage-version-migrator-controller running? --by-client rewrites the objects without it): %w", made.Name, ctx.Err())
			}
			return err
		}
		m.opts.Log("%s: StorageVersionMigration %s succeeded", crd.Name, made.Name)
		// The controller sets storedVersions once the migration has
		// succeeded, unless the CRD changed meanwhile; then it is set
		// here, as the objects are all at the storage version.
		return m.storedAlone(ctx, crd.Name, res.Storage, controllerGrace)
	}, nil
}

// controllerGrace is how long storedVersions is left to the migration's
// controller before Run sets it.
const controllerGrace = 10 * time.Second

// byClient reads every object of the CRD's resource, at its storage
// version, and writes each back unchanged: kube-apiserver stores what it
// writes at the storage version. An object changed or deleted meanwhile
// was written by someone else, at the storage version too.
func (m *migrator) byClient(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, res *Result) error {
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: res.Storage, Resource: crd.Spec.Names.Plural}
	r := m.dyn.Resource(gvr)
	cont := ""
	for {
		list, err := r.List(ctx, metav1.ListOptions{Limit: 500, Continue: cont})
		if err != nil {
			return fmt.Errorf("listing %s: %w", gvr.Resource, err)
		}
		for i := range list.Items {
			o := &list.Items[i]
			var err error
			if ns := o.GetNamespace(); ns != "" {
				_, err = r.Namespace(ns).Update(ctx, o, metav1.UpdateOptions{FieldManager: FieldManager})
			} else {
				_, err = r.Update(ctx, o, metav1.UpdateOptions{FieldManager: FieldManager})
			}
			switch {
			case err == nil:
				res.Rewritten++
			case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			default:
				return fmt.Errorf("writing back %s %s/%s: %w", gvr.Resource, o.GetNamespace(), o.GetName(), err)
			}
		}
		if cont = list.GetContinue(); cont == "" {
			break
		}
	}
	m.opts.Log("%s: %d objects written back", crd.Name, res.Rewritten)
	return m.storedAlone(ctx, crd.Name, res.Storage, 0)
}

// storedAlone waits up to grace for storedVersions to list version alone,
// then sets it.
func (m *migrator) storedAlone(ctx context.Context, name, version string, grace time.Duration) error {
	until := time.Now().Add(grace)
	for conflicts := 0; conflicts < 100; {
		crd, err := m.ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if slices.Equal(crd.Status.StoredVersions, []string{version}) {
			m.opts.Log("%s: storedVersions is [%s]", name, version)
			return nil
		}
		if time.Now().Before(until) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(m.opts.Poll):
			}
			continue
		}
		if storage(crd) != version {
			return errors.New("its storage version changed while it was migrated: run the migration again")
		}
		crd.Status.StoredVersions = []string{version}
		_, err = m.ext.ApiextensionsV1().CustomResourceDefinitions().UpdateStatus(ctx, crd, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			m.opts.Log("%s: storedVersions set to [%s]", name, version)
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("setting storedVersions: %w", err)
		}
		conflicts++
	}
	return errors.New("setting storedVersions: the CRD kept changing")
}
