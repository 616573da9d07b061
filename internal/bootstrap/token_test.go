package bootstrap

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	bootstrapsecrets "k8s.io/cluster-bootstrap/util/secrets"
)

var (
	idPattern     = regexp.MustCompile(`^[a-z0-9]{6}$`)
	secretPattern = regexp.MustCompile(`^[a-z0-9]{16}$`)
)

func TestNewTokenHasKubeadmsFormat(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		if !idPattern.MatchString(tok.ID) || !secretPattern.MatchString(tok.Secret) {
			t.Fatalf("token %q.%q: want a 6-character ID and a 16-character secret of [a-z0-9]", tok.ID, tok.Secret)
		}
		if v := tok.Value(); v != tok.ID+"."+tok.Secret {
			t.Fatalf("Value() = %q, want %q", v, tok.ID+"."+tok.Secret)
		}
		if seen[tok.Value()] {
			t.Fatalf("NewToken made %s twice", tok)
		}
		seen[tok.Value()] = true
	}
}

func TestParseToken(t *testing.T) {
	tok, err := ParseToken("abcdef.0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	if tok.ID != "abcdef" || tok.Secret != "0123456789abcdef" {
		t.Fatalf("ParseToken = %+v", Token{ID: tok.ID, Secret: tok.Secret})
	}
	for _, bad := range []string{
		"",
		"abcdef",
		"abcdef.",
		".0123456789abcdef",
		"abcde.0123456789abcdef",           // ID too short
		"abcdefg.0123456789abcdef",         // ID too long
		"ABCDEF.0123456789abcdef",          // upper case
		"abcdef.0123456789abcde",           // secret too short
		"abcdef.0123456789abcdef0",         // secret too long
		"abcdef.0123456789abcdeF",          // upper case in the secret
		"abcdef.0123456789abcd-f",          // not [a-z0-9]
		"abcdef.0123456789abcdef.abcdef",   // three parts
		"abcdef:0123456789abcdef",          // wrong separator
		" abcdef.0123456789abcdef",         // space
		"abcdef.0123456789abcdef\n",        // trailing newline
		"abcdef.sec\u00e9et0123456789ab",   // not ASCII
		"abcdef.zzzzzzzzzzzzzzzz.zzzzzzzz", // three parts again
	} {
		if _, err := ParseToken(bad); err == nil {
			t.Errorf("ParseToken(%q) accepted it", bad)
			continue
		} else if len(bad) > 7 && strings.Contains(err.Error(), bad[7:]) {
			t.Errorf("ParseToken(%q)'s error %q shows the secret part", bad, err)
		}
	}
}

func TestTokenPrintsWithoutItsSecret(t *testing.T) {
	tok := Token{ID: "abcdef", Secret: "0123456789abcdef"}
	for _, s := range []string{tok.String(), fmt.Sprint(tok), fmt.Sprintf("%v %+v %#v %s", tok, tok, tok, tok)} {
		if strings.Contains(s, tok.Secret) {
			t.Errorf("%q shows the secret", s)
		}
		if !strings.Contains(s, tok.ID) {
			t.Errorf("%q does not show the ID", s)
		}
	}
}

func TestTokenSecretIsKubeadmsFormat(t *testing.T) {
	tok := Token{ID: "abcdef", Secret: "0123456789abcdef"}
	exp := time.Date(2031, 5, 6, 7, 8, 9, 0, time.FixedZone("x", 2*3600))
	labels := map[string]string{"machinist.dev/machine": "m-1"}
	s := TokenSecret(tok, TokenOptions{Expiration: exp, Description: "for Machine m-1", Labels: labels})
	labels["machinist.dev/machine"] = "changed" // the Secret has its own copy

	if s.Namespace != "kube-system" || s.Name != "bootstrap-token-abcdef" {
		t.Errorf("Secret %s/%s, want kube-system/bootstrap-token-abcdef", s.Namespace, s.Name)
	}
	if s.Type != "bootstrap.kubernetes.io/token" {
		t.Errorf("type %q", s.Type)
	}
	if s.Labels["machinist.dev/machine"] != "m-1" || len(s.Labels) != 1 {
		t.Errorf("labels %v, want only machinist.dev/machine=m-1", s.Labels)
	}
	want := map[string]string{
		"token-id":                       "abcdef",
		"token-secret":                   "0123456789abcdef",
		"expiration":                     "2031-05-06T05:08:09Z",
		"usage-bootstrap-authentication": "true",
		"auth-extra-groups":              "system:bootstrappers:machinist:nodes",
		"description":                    "for Machine m-1",
	}
	for k, v := range want {
		if got := string(s.Data[k]); got != v {
			t.Errorf("data[%s] = %q, want %q", k, got, v)
		}
	}
	if len(s.Data) != len(want) {
		t.Errorf("data has %d keys, want %d: a token for signing too would be more than joining needs", len(s.Data), len(want))
	}

	// As Kubernetes' own code reads such a Secret.
	if id, ok := bootstrapsecrets.ParseName(s.Name); !ok || id != tok.ID {
		t.Errorf("ParseName(%q) = %q, %v", s.Name, id, ok)
	}
	groups, err := bootstrapsecrets.GetGroups(s)
	if err != nil {
		t.Fatalf("GetGroups: %v", err)
	}
	if strings.Join(groups, ",") != bootstrapapi.BootstrapDefaultGroup+","+NodeGroup {
		t.Errorf("groups %v, want %s and %s", groups, bootstrapapi.BootstrapDefaultGroup, NodeGroup)
	}
	if bootstrapsecrets.HasExpired(s, exp.Add(-time.Second)) || !bootstrapsecrets.HasExpired(s, exp.Add(time.Second)) {
		t.Errorf("expiration %s is not read as %s", s.Data["expiration"], exp)
	}

	back, err := TokenFromSecret(s)
	if err != nil || back != tok {
		t.Errorf("TokenFromSecret = %v, %v; want %v", back, err, tok)
	}
}

func TestTokenSecretPutsTheTokenInTheGroupsAsked(t *testing.T) {
	tok := Token{ID: "abcdef", Secret: "0123456789abcdef"}
	kubeadm := "system:bootstrappers:kubeadm:default-node-token"
	for _, c := range []struct {
		name   string
		groups []string
		want   []string
	}{
		{"none", nil, []string{NodeGroup}},
		{"empty", []string{}, []string{NodeGroup}},
		{"kubeadm's", []string{kubeadm}, []string{kubeadm}},
		{"two", []string{kubeadm, NodeGroup}, []string{kubeadm, NodeGroup}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := TokenSecret(tok, TokenOptions{Groups: c.groups})
			// As kube-apiserver's authenticator reads them: it refuses the
			// token outright if a group is malformed.
			got, err := bootstrapsecrets.GetGroups(s)
			if err != nil {
				t.Fatalf("GetGroups: %v", err)
			}
			want := append([]string{bootstrapapi.BootstrapDefaultGroup}, c.want...)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("groups %v, want %v", got, want)
			}
		})
	}
}

func TestTokenUserIsWhoTheAPIServerSaysItIs(t *testing.T) {
	tok := Token{ID: "abcdef", Secret: "0123456789abcdef"}
	if u := tok.User(); u != "system:bootstrap:abcdef" {
		t.Errorf("User() = %q, want system:bootstrap:abcdef", u)
	}
	if strings.Contains(tok.User(), tok.Secret) {
		t.Errorf("User() %q shows the secret", tok.User())
	}
}

func TestTokenSecretDefaultsToAShortLife(t *testing.T) {
	before := time.Now()
	s := TokenSecret(Token{ID: "abcdef", Secret: "0123456789abcdef"}, TokenOptions{})
	remaining, expired := bootstrapsecrets.GetExpiration(s, before)
	if expired || remaining <= DefaultTokenTTL-time.Minute || remaining > DefaultTokenTTL+time.Second {
		t.Errorf("a token without an expiration lasts %s (expired %v), want about %s", remaining, expired, DefaultTokenTTL)
	}
	if s.Labels != nil {
		t.Errorf("labels %v, want none", s.Labels)
	}
}

func TestTokenFromSecretRefusesOthers(t *testing.T) {
	good := TokenSecret(Token{ID: "abcdef", Secret: "0123456789abcdef"}, TokenOptions{})
	opaque := good.DeepCopy()
	opaque.Type = corev1.SecretTypeOpaque
	renamed := good.DeepCopy()
	renamed.Name = "bootstrap-token-zzzzzz"
	short := good.DeepCopy()
	short.Data["token-secret"] = []byte("short")
	for name, s := range map[string]*corev1.Secret{"nil": nil, "opaque": opaque, "renamed": renamed, "short secret": short} {
		if _, err := TokenFromSecret(s); err == nil {
			t.Errorf("%s: TokenFromSecret accepted it", name)
		}
	}
}

func TestNodeGroupIsABootstrapGroup(t *testing.T) {
	// kube-apiserver ignores an auth-extra-groups entry outside
	// system:bootstrappers:*, which would leave the token without RBAC.
	if err := bootstraputil.ValidateBootstrapGroupName(NodeGroup); err != nil {
		t.Fatal(err)
	}
	if err := bootstraputil.ValidateUsages([]string{"authentication"}); err != nil {
		t.Fatal(err)
	}
}

func TestClusterRoleBindingsGrantWhatKubeadmGrants(t *testing.T) {
	roles, bindings, err := RBAC()
	if err != nil {
		t.Fatal(err)
	}
	if len(roles) != 1 || roles[0].Name != RoleNodeRegisterAfresh {
		t.Errorf("roles %v, want %s alone", roles, RoleNodeRegisterAfresh)
	}
	got := map[string]string{}
	for _, b := range bindings {
		if len(b.Subjects) != 1 || b.Subjects[0].Kind != "Group" || b.RoleRef.Kind != "ClusterRole" {
			t.Fatalf("%s: %+v", b.Name, b)
		}
		got[b.RoleRef.Name] = b.Subjects[0].Name
	}
	want := map[string]string{
		"system:node-bootstrapper": NodeGroup,
		"system:certificates.k8s.io:certificatesigningrequests:nodeclient":     NodeGroup,
		"system:certificates.k8s.io:certificatesigningrequests:selfnodeclient": "system:nodes",
		"machinist:node-register-afresh":                                       "system:nodes",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("bindings %v, want %v", got, want)
	}
}
