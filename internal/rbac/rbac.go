// Package rbac declares the permissions the Machinist manager runs with.
//
// The declarations are controller-gen markers; `make manifests` turns them
// into config/rbac/role.yaml. They sit in one place, beside no controller,
// because every controller of the manager shares one ServiceAccount and one
// ClusterRole.
package rbac

// Machinist's own kinds: the controllers read and write them all, and their
// status; they set finalizers on Machines.
//
// +kubebuilder:rbac:groups=machinist.dev,resources=machines;machinesets;machinedeployments;machineclasses;machinehealthchecks;machinedisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=machinist.dev,resources=machines/status;machinesets/status;machinedeployments/status;machineclasses/status;machinehealthchecks/status;machinedisruptionbudgets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=machinist.dev,resources=machines/finalizers;machinesets/finalizers;machinedeployments/finalizers,verbs=update

// MachineDrainRules are made by people; the Machine controller reads
// them to order a drain.
//
// +kubebuilder:rbac:groups=machinist.dev,resources=machinedrainrules,verbs=get;list;watch

// WorkloadClusters are made by people; the manager keeps their status and
// holds a deleted one with a finalizer until no Machine serves it.
//
// +kubebuilder:rbac:groups=machinist.dev,resources=workloadclusters,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=machinist.dev,resources=workloadclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=machinist.dev,resources=workloadclusters/finalizers,verbs=update

// The ManagementCluster stands for the manager's own cluster: the manager
// makes it (again, if it is deleted) and keeps its status. In that
// cluster it checks, as in each WorkloadCluster, whether machines can
// join: with a short-lived bootstrap token in kube-system (the Secrets
// rule below) it asks for a node certificate, whose request it reads and
// then deletes.
//
// +kubebuilder:rbac:groups=machinist.dev,resources=managementclusters,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=machinist.dev,resources=managementclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;delete

// Secrets, read one at a time and never listed or watched, so that the
// manager caches no Secret of any namespace: get reads the kubeconfig each
// WorkloadCluster names, in the WorkloadCluster's namespace; create, get
// and delete (each by the name derived from a Machine's UID) handle the
// bootstrap tokens that let a new machine's kubelet join the manager's own
// cluster, in kube-system. Markers make only
// cluster-wide rules, so this grants those verbs in every namespace;
// docs/operations.md shows how to narrow them with Roles.
//
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;delete

// The Machine controller labels, taints, cordons and deletes Nodes and
// drains them by evicting their pods. It writes a Node's status only to
// give a kubelet run with --cloud-provider=external the addresses its
// provider gives, as a cloud controller manager does; marking a dead
// kubelet's Node is the node lifecycle controller's job.
// After a hard reboot of an unreachable Node it deletes the pods that died
// with the old boot, which no kubelet is left to confirm.
//
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch

// A drain reads the labels of its pods' namespaces, which MachineDrainRules
// may select pods by, and a Machine's instance is deleted only once no
// VolumeAttachment names its Node.
//
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=storage.k8s.io,resources=volumeattachments,verbs=get;list;watch

// The Machine controller believes the requester a request annotation
// names only while the admission policy that vouches for it is bound.
//
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,verbs=get

// Events record every lifecycle transition; Leases carry leader election.
//
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete

// With --metrics-secure, /metrics answers only a bearer token that
// kube-apiserver vouches for (TokenReview) and allows get on /metrics
// (SubjectAccessReview); the manager asks both questions for each scraper.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
