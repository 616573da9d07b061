package nodeagent_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/dev/testenv"
	"github.com/machinist-dev/machinist/internal/bootstrap"
	"github.com/machinist-dev/machinist/providers/nodeagent"
)

// joinWait bounds a join: kube-controller-manager, started with the
// control plane, may still be coming up when the first test asks.
const joinWait = time.Minute

func whoAmI(ctx context.Context, cfg *rest.Config) (authenticationv1.UserInfo, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

func tokenConfig(j bootstrap.Join, token string) *rest.Config {
	return &rest.Config{Host: j.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: j.CAData}}
}

func TestJoinGetsANodeClientCertificateApprovedAndSigned(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const name = "joined-cert"

	// Before: the token is a bootstrapper in Machinist's bootstrap group.
	j, err := env.Join(ctx, bootstrap.TokenOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	token, err := bootstrap.ParseToken(j.Token)
	g.Expect(err).NotTo(HaveOccurred())
	bootstrapper, err := whoAmI(ctx, tokenConfig(j, j.Token))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bootstrapper.Username).To(Equal("system:bootstrap:" + token.ID))
	g.Expect(bootstrapper.Groups).To(ContainElements("system:bootstrappers", bootstrap.NodeGroup))

	joinCtx, cancel := context.WithTimeout(ctx, joinWait)
	defer cancel()
	creds, err := nodeagent.Join(joinCtx, j, name, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(creds.Server).To(Equal(j.Server))

	// The certificate is the node's, for client auth, signed by the CA
	// kube-apiserver trusts, and goes with the key the agent kept.
	_, err = tls.X509KeyPair(creds.CertPEM, creds.KeyPEM)
	g.Expect(err).NotTo(HaveOccurred(), "certificate and key do not match")
	block, _ := pem.Decode(creds.CertPEM)
	g.Expect(block).NotTo(BeNil())
	cert, err := x509.ParseCertificate(block.Bytes)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cert.Subject.CommonName).To(Equal("system:node:" + name))
	g.Expect(cert.Subject.Organization).To(Equal([]string{"system:nodes"}))
	roots := x509.NewCertPool()
	g.Expect(roots.AppendCertsFromPEM(env.ClusterCA())).To(BeTrue())
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	g.Expect(err).NotTo(HaveOccurred())

	// The request was the token's, approved by kube-controller-manager's
	// approver (not by a person) and issued.
	csrs, err := clientset.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	var mine []certificatesv1.CertificateSigningRequest
	for _, csr := range csrs.Items {
		if csr.Spec.Username == bootstrapper.Username {
			mine = append(mine, csr)
		}
	}
	g.Expect(mine).To(HaveLen(1))
	csr := mine[0]
	g.Expect(csr.Spec.SignerName).To(Equal(certificatesv1.KubeAPIServerClientKubeletSignerName))
	g.Expect(csr.Spec.Groups).To(ContainElement(bootstrap.NodeGroup))
	g.Expect(csr.Status.Conditions).To(ContainElement(And(
		HaveField("Type", certificatesv1.CertificateApproved),
		HaveField("Status", corev1.ConditionTrue),
		HaveField("Reason", "AutoApproved"),
	)))
	for _, c := range csr.Status.Conditions {
		g.Expect(c.Type).NotTo(BeElementOf(certificatesv1.CertificateDenied, certificatesv1.CertificateFailed), c.Message)
	}
	g.Expect(csr.Status.Certificate).To(Equal(creds.CertPEM))

	// With it, the machine is its Node, no longer a bootstrapper.
	user, err := whoAmI(ctx, creds.Config())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(user.Username).To(Equal("system:node:" + name))
	g.Expect(user.Groups).To(ContainElements("system:nodes", "system:authenticated"))
	g.Expect(user.Groups).NotTo(ContainElement(HavePrefix("system:bootstrappers")))

	// What a kubelet keeps on disk says the same.
	kubeconfig, err := creds.Kubeconfig()
	g.Expect(err).NotTo(HaveOccurred())
	again, err := nodeagent.CredentialsFromKubeconfig(kubeconfig)
	g.Expect(err).NotTo(HaveOccurred())
	user, err = whoAmI(ctx, again.Config())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(user.Username).To(Equal("system:node:" + name))
}

func TestAJoinedAgentRunsItsOwnNodeLeaseAndPods(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const name = "joined-agent"
	kube := env.NodeClient(t, name)

	// A lone agent with nothing but its own credentials, as a machine has.
	cfg := nodeagent.Config{Client: kube, NodeName: name, ProviderID: "test:///" + name, Version: "v1.37.2",
		RenewInterval: renew, LeaseDurationSeconds: 3}
	agent := nodeagent.New(cfg)
	boot := func() (stop func() error) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- agent.Run(runCtx) }()
		return func() error { cancel(); return <-done }
	}
	stop := boot()

	g.Eventually(func(g Gomega) {
		g.Expect(readyOf(getNode(g, name))).To(HaveField("Status", corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	node := getNode(g, name)
	g.Expect(node.Spec.ProviderID).To(Equal("test:///" + name))
	// The Lease is made after the Node: Ready may show first.
	var first time.Time
	g.Eventually(func(g Gomega) { first = renewTime(g, name) }).WithTimeout(wait).Should(Succeed(), "the agent makes its Lease")
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, name)).To(BeTemporally(">", first))
	}).WithTimeout(wait).Should(Succeed(), "the agent renews its Lease")

	// Its pods: run, then deleted for good once deleted.
	pod, err := clientset.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, newPod("joined-agent-pod", name), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func(g Gomega) {
		p, err := clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
		g.Expect(podReady(p)).To(BeTrue())
	}).WithTimeout(wait).Should(Succeed(), "the agent reports its pod running")
	g.Expect(clientset.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(func() bool {
		_, err := clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}).WithTimeout(wait).Should(BeTrue(), "the agent finishes its pod's deletion")

	// A reboot takes the existing Node and Lease over: reads and updates.
	oldBoot := node.Status.NodeInfo.BootID
	g.Expect(stop()).To(Succeed())
	stop = boot()
	defer func() { g.Expect(stop()).To(Succeed()) }()
	g.Eventually(func(g Gomega) {
		g.Expect(getNode(g, name).Status.NodeInfo.BootID).To(And(Not(Equal(oldBoot)), Equal(agent.BootID())))
	}).WithTimeout(wait).Should(Succeed())
	rebooted := renewTime(g, name)
	g.Eventually(func(g Gomega) {
		g.Expect(renewTime(g, name)).To(BeTemporally(">", rebooted))
	}).WithTimeout(wait).Should(Succeed(), "the rebooted agent renews its Lease")
}

func TestAJoinedNodeMayNotTouchWhatIsNotItsOwn(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	const name, other = "joined-confined", "joined-confined-other"
	j := env.JoinData(t)
	creds := env.NodeCredentials(t, j, name)
	token, err := bootstrap.ParseToken(j.Token)
	g.Expect(err).NotTo(HaveOccurred())
	kube, err := kubernetes.NewForConfig(creds.Config())
	g.Expect(err).NotTo(HaveOccurred())
	c, err := client.New(creds.Config(), client.Options{Scheme: env.Scheme})
	g.Expect(err).NotTo(HaveOccurred())

	otherNode, err := clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	otherPod, err := clientset.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, newPod("joined-confined-others-pod", other), metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	forbidden := map[string]error{}
	_, forbidden["get another Node"] = kube.CoreV1().Nodes().Get(ctx, other, metav1.GetOptions{})
	_, forbidden["list Nodes"] = kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	relabelled := otherNode.DeepCopy()
	relabelled.Labels = map[string]string{"stolen": "true"}
	_, forbidden["update another Node"] = kube.CoreV1().Nodes().Update(ctx, relabelled, metav1.UpdateOptions{})
	forbidden["delete another Node"] = kube.CoreV1().Nodes().Delete(ctx, other, metav1.DeleteOptions{})
	_, forbidden["create another Node"] = kube.CoreV1().Nodes().Create(ctx,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "joined-confined-made-up"}}, metav1.CreateOptions{})
	_, forbidden["create another Node's Lease"] = kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx,
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: other, Namespace: corev1.NamespaceNodeLease}}, metav1.CreateOptions{})
	_, forbidden["list every pod"] = kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	_, forbidden["get another Node's pod"] = kube.CoreV1().Pods(otherPod.Namespace).Get(ctx, otherPod.Name, metav1.GetOptions{})
	forbidden["delete another Node's pod"] = kube.CoreV1().Pods(otherPod.Namespace).Delete(ctx, otherPod.Name, metav1.DeleteOptions{})
	_, forbidden["get its token's Secret"] = kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, token.SecretName(), metav1.GetOptions{})
	_, forbidden["list Secrets"] = kube.CoreV1().Secrets(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	forbidden["list Machines"] = c.List(ctx, &machinistv1.MachineList{}, client.InNamespace(metav1.NamespaceDefault))
	forbidden["create a Machine"] = c.Create(ctx, &machinistv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "joined-confined"}})
	forbidden["get a Machine"] = c.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceDefault, Name: name}, &machinistv1.Machine{})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: want 403, got %v", what, err)
		}
	}

	// What it may: its own Node, its own pods by the field selector a
	// kubelet uses.
	_, err = kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "its own Node, not yet registered: want 404, got %v", err)
	_, err = kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(clientset.CoreV1().Pods(otherPod.Namespace).Delete(ctx, otherPod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})).To(Succeed())
	g.Expect(clientset.CoreV1().Nodes().Delete(ctx, other, metav1.DeleteOptions{})).To(Succeed())
}

func TestAWrongTokenIsUnauthorized(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	j, err := env.Join(ctx, bootstrap.TokenOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	real, err := bootstrap.ParseToken(j.Token)
	g.Expect(err).NotTo(HaveOccurred())
	unknown, err := bootstrap.NewToken()
	g.Expect(err).NotTo(HaveOccurred())
	wrongSecret := bootstrap.Token{ID: real.ID, Secret: strings.Repeat("0", 16)}
	if wrongSecret.Secret == real.Secret {
		wrongSecret.Secret = strings.Repeat("1", 16)
	}

	for what, token := range map[string]string{"a token never stored": unknown.Value(), "a stored token's ID with another secret": wrongSecret.Value()} {
		_, err := whoAmI(ctx, tokenConfig(j, token))
		g.Expect(apierrors.IsUnauthorized(err)).To(BeTrue(), "%s: want 401, got %v", what, err)

		bad := j
		bad.Token = token
		joinCtx, cancel := context.WithTimeout(ctx, joinWait)
		_, err = nodeagent.Join(joinCtx, bad, "joined-wrong-token", nil)
		cancel()
		g.Expect(apierrors.IsUnauthorized(err)).To(BeTrue(), "%s: joining: want 401, got %v", what, err)
		// The machine says why, in words its Machine can show.
		je, ok := errors.AsType[*nodeagent.JoinError](err)
		g.Expect(ok).To(BeTrue(), "%s: want a *JoinError, got %T", what, err)
		g.Expect(je.Reason).To(Equal(machinistv1.ReasonBootstrapTokenRefused))
		g.Expect(je.Message).To(ContainSubstring("--enable-bootstrap-token-auth"))
		g.Expect(je.Message).NotTo(ContainSubstring(token), "a join's explanation never carries its token")
	}
	// The right one still works: the 401s were the tokens', not the server's.
	_, err = whoAmI(ctx, tokenConfig(j, j.Token))
	g.Expect(err).NotTo(HaveOccurred())
}

func TestAnExpiredTokensSecretIsDeleted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	j, err := env.Join(ctx, bootstrap.TokenOptions{Expiration: time.Now().Add(2 * time.Second)})
	g.Expect(err).NotTo(HaveOccurred())
	token, err := bootstrap.ParseToken(j.Token)
	g.Expect(err).NotTo(HaveOccurred())
	lasting, err := env.Join(ctx, bootstrap.TokenOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	lastingToken, err := bootstrap.ParseToken(lasting.Token)
	g.Expect(err).NotTo(HaveOccurred())

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: token.SecretName()}}
	took := testenv.WaitFor(t, time.Minute, "the token cleaner deletes the expired token's Secret", func() error {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(secret), secret)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return errors.New("still there")
	})
	t.Logf("deleted %s after it was made", took)
	_, err = whoAmI(ctx, tokenConfig(j, j.Token))
	g.Expect(apierrors.IsUnauthorized(err)).To(BeTrue(), "the expired token: want 401, got %v", err)

	// Only the expired one.
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: lastingToken.SecretName()}, &corev1.Secret{})).To(Succeed())
}

func TestJoinAWorkloadCluster(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	workload, err := testenv.StartWorkload()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(workload.Stop()).To(Succeed()) })

	const name = "joined-workload"
	creds := workload.NodeCredentials(t, workload.JoinData(t), name)
	g.Expect(creds.Server).To(Equal(workload.Config.Host))
	kube, err := kubernetes.NewForConfig(creds.Config())
	g.Expect(err).NotTo(HaveOccurred())
	agent := nodeagent.New(nodeagent.Config{Client: kube, NodeName: name, ProviderID: "test:///" + name, Version: "v1.37.2", RenewInterval: renew})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(runCtx) }()
	defer func() { cancel(); g.Expect(<-done).To(Succeed()) }()

	admin := kubernetes.NewForConfigOrDie(workload.Config)
	g.Eventually(func(g Gomega) {
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(readyOf(n)).To(HaveField("Status", corev1.ConditionTrue))
	}).WithTimeout(wait).Should(Succeed())
	_, err = clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the Node is the workload cluster's, not the management cluster's: %v", err)

	// The management cluster's certificate means nothing there, nor the
	// workload's here: two clusters, two CAs.
	g.Expect(workload.ClusterCA()).NotTo(Equal(env.ClusterCA()))
	_, err = whoAmI(ctx, &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{
		CAData: env.Config.CAData, CertData: creds.CertPEM, KeyData: creds.KeyPEM}})
	g.Expect(apierrors.IsUnauthorized(err)).To(BeTrue(), "a workload node's certificate at the management cluster: want 401, got %v", err)

	// No Machinist kinds are served there.
	err = workload.Client.List(ctx, &machinistv1.MachineList{})
	g.Expect(meta.IsNoMatchError(err)).To(BeTrue(), "Machines in a workload cluster: want no such kind, got %v", err)
	crds, err := admin.Discovery().ServerGroups()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(slices.ContainsFunc(crds.Groups, func(gr metav1.APIGroup) bool { return gr.Name == machinistv1.GroupVersion.Group })).To(BeFalse())
}
