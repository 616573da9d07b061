package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

// Protocol is the protocol version this package serves and speaks.
const Protocol = "v1"

// Verbs the protocol knows beyond create, exists, delete and find.
const (
	VerbReboot = providerv1.Verb_VERB_REBOOT
	VerbRepair = providerv1.Verb_VERB_REPAIR
	VerbUpdate = providerv1.Verb_VERB_UPDATE
)

// ServeOptions describe the provider being served.
type ServeOptions struct {
	// Name is the provider's name: what MachineClass.spec.provider says
	// and the scheme of its provider IDs. Required.
	Name string
	// VendorVersion is the provider's own version, for people.
	VendorVersion string
	// Verbs the provider carries out; nil means reboot and repair, and
	// update when the Actuator accepts any change in place. A verb left
	// out is refused with UNIMPLEMENTED without calling the Actuator.
	Verbs []providerv1.Verb
	// Ready, when set, answers Probe: a non-nil error means not ready.
	Ready func(context.Context) error
	// TLS is required for a TCP endpoint: the server's certificate and
	// key, and the CA that signed the clients' certificates.
	TLS TLSFiles
}

// Serve offers a on endpoint (unix:///path or tcp://host:port) until ctx
// ends, then stops gracefully. It logs the address it listens on to ctx's
// logger (logr), if any. A socket file left by an earlier run is
// replaced. This is all a Go provider needs: implement
// providers.Actuator and call Serve.
func Serve(ctx context.Context, endpoint string, a providers.Actuator, opts ServeOptions) error {
	e, err := ParseEndpoint(endpoint)
	if err != nil {
		return err
	}
	if err := checkTransport(e, opts.TLS); err != nil {
		return err
	}
	if e.Network == "unix" && !opts.TLS.Empty() {
		return fmt.Errorf("endpoint %s is a Unix socket: TLS is for tcp:// endpoints; the socket's file permissions guard it", e)
	}
	lis, err := Listen(e)
	if err != nil {
		return err
	}
	srv, err := NewServer(a, opts)
	if err != nil {
		_ = lis.Close()
		return err
	}
	// With tcp://host:0 the port is chosen here: say which.
	logr.FromContextOrDiscard(ctx).Info("serving provider", "provider", opts.Name, "address", lis.Addr().String())
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			srv.GracefulStop()
		case <-stopped:
		}
	}()
	err = srv.Serve(lis)
	close(stopped)
	if e.Network == "unix" {
		_ = os.Remove(e.Address)
	}
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Listen opens e, replacing a stale socket file; its directory is made if
// missing.
func Listen(e Endpoint) (net.Listener, error) {
	if e.Network == "unix" {
		if err := os.MkdirAll(filepath.Dir(e.Address), 0o755); err != nil {
			return nil, err
		}
		if err := os.Remove(e.Address); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
	}
	return net.Listen(e.Network, e.Address)
}

// NewServer returns a gRPC server offering a, with mutual TLS when
// opts.TLS names files. Serve is the usual way in; NewServer is for a
// provider that manages its own listener.
func NewServer(a providers.Actuator, opts ServeOptions) (*grpc.Server, error) {
	if opts.Name == "" {
		return nil, errors.New("a provider needs a name")
	}
	var sopts []grpc.ServerOption
	if !opts.TLS.Empty() {
		cfg, err := opts.TLS.serverConfig()
		if err != nil {
			return nil, err
		}
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	srv := grpc.NewServer(sopts...)
	s := &server{a: a, opts: opts, verbs: opts.Verbs}
	if s.verbs == nil {
		s.verbs = []providerv1.Verb{VerbReboot, VerbRepair}
		if a.InPlace(providers.Change{Version: true}) || a.InPlace(providers.Change{Class: true}) {
			s.verbs = append(s.verbs, VerbUpdate)
		}
	}
	providerv1.RegisterIdentityServiceServer(srv, s)
	providerv1.RegisterMachineServiceServer(srv, s)
	return srv, nil
}

type server struct {
	providerv1.UnimplementedIdentityServiceServer
	providerv1.UnimplementedMachineServiceServer
	a     providers.Actuator
	opts  ServeOptions
	verbs []providerv1.Verb
}

func (s *server) GetInfo(context.Context, *providerv1.GetInfoRequest) (*providerv1.GetInfoResponse, error) {
	return &providerv1.GetInfoResponse{Name: s.opts.Name, VendorVersion: s.opts.VendorVersion, Protocol: Protocol}, nil
}

func (s *server) GetCapabilities(context.Context, *providerv1.GetCapabilitiesRequest) (*providerv1.GetCapabilitiesResponse, error) {
	resp := &providerv1.GetCapabilitiesResponse{Verbs: s.verbs}
	if slices.Contains(s.verbs, VerbUpdate) {
		if s.a.InPlace(providers.Change{Version: true}) {
			resp.InPlace = append(resp.InPlace, providerv1.Change_CHANGE_VERSION)
		}
		if s.a.InPlace(providers.Change{Class: true}) {
			resp.InPlace = append(resp.InPlace, providerv1.Change_CHANGE_CLASS)
		}
	}
	return resp, nil
}

func (s *server) Probe(ctx context.Context, _ *providerv1.ProbeRequest) (*providerv1.ProbeResponse, error) {
	if s.opts.Ready != nil {
		if err := s.opts.Ready(ctx); err != nil {
			return &providerv1.ProbeResponse{Ready: false, Message: err.Error()}, nil
		}
	}
	return &providerv1.ProbeResponse{Ready: true}, nil
}

func (s *server) Create(ctx context.Context, req *providerv1.CreateRequest) (*providerv1.CreateResponse, error) {
	if req.GetMachineUid() == "" {
		return nil, status.Error(codes.InvalidArgument, "machine_uid is required: it is what makes Create idempotent")
	}
	m := &machinistv1.Machine{}
	if err := json.Unmarshal(req.GetMachine(), m); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "machine is not a Machine in JSON: %v", err)
	}
	if string(m.UID) != req.GetMachineUid() {
		return nil, status.Errorf(codes.InvalidArgument, "machine_uid %q is not the machine's metadata.uid %q", req.GetMachineUid(), m.UID)
	}
	var class *machinistv1.MachineClass
	if len(req.GetMachineClass()) > 0 {
		class = &machinistv1.MachineClass{}
		if err := json.Unmarshal(req.GetMachineClass(), class); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "machine_class is not a MachineClass in JSON: %v", err)
		}
	}
	join := joinFromWire(req.GetJoin())
	if err := needJoin(join, "Create of machine "+m.Namespace+"/"+m.Name); err != nil {
		return nil, err
	}
	id, err := s.a.Create(ctx, m, class, join)
	if err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.CreateResponse{ProviderId: id}, nil
}

func (s *server) Exists(ctx context.Context, req *providerv1.ExistsRequest) (*providerv1.ExistsResponse, error) {
	if err := needID(req.GetProviderId()); err != nil {
		return nil, err
	}
	ok, err := s.a.Exists(ctx, req.GetProviderId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.ExistsResponse{Exists: ok}, nil
}

func (s *server) Describe(ctx context.Context, req *providerv1.DescribeRequest) (*providerv1.DescribeResponse, error) {
	if err := needID(req.GetProviderId()); err != nil {
		return nil, err
	}
	in, err := s.a.Describe(ctx, req.GetProviderId())
	if err != nil {
		return nil, toStatus(err)
	}
	power := providerv1.PowerState_POWER_STATE_UNSPECIFIED
	switch in.Power {
	case providers.PowerOn:
		power = providerv1.PowerState_POWER_STATE_ON
	case providers.PowerOff:
		power = providerv1.PowerState_POWER_STATE_OFF
	}
	resp := &providerv1.DescribeResponse{Power: power, BootId: in.BootID}
	if !in.Owner.IsZero() {
		resp.Owner = &providerv1.Owner{Namespace: in.Owner.Namespace, Name: in.Owner.Name, Uid: string(in.Owner.UID)}
	}
	if f := in.JoinFailure; f != nil {
		resp.JoinFailure = &providerv1.JoinFailure{Reason: f.Reason, Message: f.Message}
	}
	for _, a := range in.Addresses {
		resp.Addresses = append(resp.Addresses, &providerv1.NodeAddress{Type: string(a.Type), Address: a.Address})
	}
	return resp, nil
}

func (s *server) Delete(ctx context.Context, req *providerv1.DeleteRequest) (*providerv1.DeleteResponse, error) {
	if err := needID(req.GetProviderId()); err != nil {
		return nil, err
	}
	if err := s.a.Delete(ctx, req.GetProviderId()); err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.DeleteResponse{}, nil
}

func (s *server) FindByUID(ctx context.Context, req *providerv1.FindByUIDRequest) (*providerv1.FindByUIDResponse, error) {
	if req.GetMachineUid() == "" {
		return nil, status.Error(codes.InvalidArgument, "machine_uid is required")
	}
	id, err := s.a.FindByUID(ctx, types.UID(req.GetMachineUid()))
	if err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.FindByUIDResponse{ProviderId: id}, nil
}

func (s *server) List(ctx context.Context, _ *providerv1.ListRequest) (*providerv1.ListResponse, error) {
	listed, err := providers.List(ctx, s.a)
	if errors.Is(err, providers.ErrNoList) {
		return nil, status.Errorf(codes.Unimplemented, "provider %s cannot list its instances", s.opts.Name)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &providerv1.ListResponse{Instances: make([]*providerv1.ListedInstance, 0, len(listed))}
	for _, l := range listed {
		in := &providerv1.ListedInstance{ProviderId: l.ProviderID}
		if !l.Owner.IsZero() {
			in.Owner = &providerv1.Owner{Namespace: l.Owner.Namespace, Name: l.Owner.Name, Uid: string(l.Owner.UID)}
		}
		resp.Instances = append(resp.Instances, in)
	}
	return resp, nil
}

func (s *server) Reboot(ctx context.Context, req *providerv1.RebootRequest) (*providerv1.RebootResponse, error) {
	if err := s.operation(VerbReboot, req.GetProviderId(), req.GetOperationId()); err != nil {
		return nil, err
	}
	op := providers.Operation{ID: req.GetOperationId(), Hard: req.GetHard()}
	if err := s.a.Reboot(ctx, req.GetProviderId(), op); err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.RebootResponse{}, nil
}

func (s *server) Repair(ctx context.Context, req *providerv1.RepairRequest) (*providerv1.RepairResponse, error) {
	if err := s.operation(VerbRepair, req.GetProviderId(), req.GetOperationId()); err != nil {
		return nil, err
	}
	join := joinFromWire(req.GetJoin())
	if err := needJoin(join, "Repair of "+req.GetProviderId()); err != nil {
		return nil, err
	}
	if err := s.a.Repair(ctx, req.GetProviderId(), providers.Operation{ID: req.GetOperationId(), Join: join}); err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.RepairResponse{}, nil
}

func (s *server) Update(ctx context.Context, req *providerv1.UpdateRequest) (*providerv1.UpdateResponse, error) {
	if err := s.operation(VerbUpdate, req.GetProviderId(), req.GetOperationId()); err != nil {
		return nil, err
	}
	if req.GetVersion() == "" {
		return nil, status.Error(codes.InvalidArgument, "version is required: it is what the instance is updated to")
	}
	op := providers.Operation{ID: req.GetOperationId(), Version: req.GetVersion()}
	if err := s.a.Update(ctx, req.GetProviderId(), op); err != nil {
		return nil, toStatus(err)
	}
	return &providerv1.UpdateResponse{}, nil
}

// operation checks what every verb needs before the Actuator is asked.
func (s *server) operation(verb providerv1.Verb, providerID, operationID string) error {
	if !slices.Contains(s.verbs, verb) {
		return status.Errorf(codes.Unimplemented, "provider %s does not %s machines", s.opts.Name, verbName(verb))
	}
	if err := needID(providerID); err != nil {
		return err
	}
	if operationID == "" {
		return status.Error(codes.InvalidArgument, "operation_id is required: it is what makes the call idempotent")
	}
	return nil
}

// needJoin refuses, as malformed, a request whose machine could not join
// its cluster, before the Actuator is asked.
func needJoin(j providers.Join, call string) error {
	if err := providers.RequireJoin(j, call); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

func needID(id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "provider_id is required")
	}
	return nil
}

// verbName is the verb as a person says it.
func verbName(v providerv1.Verb) string {
	switch v {
	case VerbReboot:
		return "reboot"
	case VerbRepair:
		return "repair"
	case VerbUpdate:
		return "update"
	}
	return fmt.Sprintf("verb %d", v)
}
