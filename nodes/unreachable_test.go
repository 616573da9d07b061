package nodes_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/machinist-dev/machinist/nodes"
)

// The errors client-go returns for a cluster that does not answer, or
// answers that it cannot serve, are told from refusals of the request.
func TestUnreachable(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()

	answering := func(code int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}`, code)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(silent.Close)

	for _, tc := range []struct {
		name        string
		host        string
		unreachable bool
	}{
		{"connection refused", "http://" + closed, true},
		{"no answer within the timeout", silent.URL, true},
		{"503", answering(http.StatusServiceUnavailable), true},
		{"504 server timeout", answering(http.StatusGatewayTimeout), true},
		{"404", answering(http.StatusNotFound), false},
		{"403", answering(http.StatusForbidden), false},
		{"409", answering(http.StatusConflict), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := kubernetes.NewForConfigOrDie(&rest.Config{Host: tc.host, Timeout: 500 * time.Millisecond})
			_, err := kube.CoreV1().Secrets("kube-system").Get(context.Background(), "bootstrap-token-abcdef", metav1.GetOptions{})
			if err == nil {
				t.Fatal("no error")
			}
			if got := nodes.Unreachable(fmt.Errorf("making the join data: %w", err)); got != tc.unreachable {
				t.Errorf("Unreachable(%v) = %v, want %v", err, got, tc.unreachable)
			}
		})
	}
	if nodes.Unreachable(nil) {
		t.Error("Unreachable(nil)")
	}
}
