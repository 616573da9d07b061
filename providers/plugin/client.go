package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	machinistv1 "github.com/machinist-dev/machinist/api/v1beta1"
	"github.com/machinist-dev/machinist/providers"
	providerv1 "github.com/machinist-dev/machinist/providers/plugin/v1"
)

// DialOptions tune a Client.
type DialOptions struct {
	// TLS is required for a TCP endpoint: the client's certificate and
	// key, and the CA that signed the provider's certificate.
	TLS TLSFiles
	// Timeout bounds each call (0: 30s). A call's own deadline, when
	// sooner, wins.
	Timeout time.Duration
	// Refresh is how long the provider's identity and capabilities are
	// trusted before they are asked again (0: 1m), so that a provider
	// upgraded in place is noticed.
	Refresh time.Duration
}

// serviceConfig retries every call that found no provider (UNAVAILABLE):
// every call of the protocol is idempotent, so a retry is safe. Other
// errors go back to the Machine controller, whose backoff is slower and
// visible on the Machine.
const serviceConfig = `{
  "methodConfig": [{
    "name": [{"service": "machinist.provider.v1.MachineService"}, {"service": "machinist.provider.v1.IdentityService"}],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// Client is an providers.Actuator that calls a provider over the
// protocol. It looks to the Machine controller like any in-process one.
type Client struct {
	name     string
	endpoint Endpoint
	opts     DialOptions
	conn     *grpc.ClientConn
	identity providerv1.IdentityServiceClient
	machines providerv1.MachineServiceClient

	asking singleflight.Group
	// mu guards name (learned when Dial was given none) and the answer
	// to the last question.
	mu      sync.Mutex
	caps    *providerv1.GetCapabilitiesResponse
	checked time.Time
}

var (
	_ providers.Actuator = (*Client)(nil)
	_ providers.Pinger   = (*Client)(nil)
)

// Dial returns a Client for the provider called name at endpoint. It does
// not wait for the provider: a provider that is not there yet makes calls
// fail as Unavailable until it is. An empty name accepts whichever provider
// the endpoint serves (the conformance suite dials so); a manager always
// names the provider it expects.
func Dial(name, endpoint string, opts DialOptions) (*Client, error) {
	e, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if err := checkTransport(e, opts.TLS); err != nil {
		return nil, err
	}
	if e.Network == "unix" && !opts.TLS.Empty() {
		return nil, fmt.Errorf("endpoint %s is a Unix socket: TLS is for tcp:// endpoints; the socket's file permissions guard it", e)
	}
	creds := insecure.NewCredentials()
	if !opts.TLS.Empty() {
		cfg, err := opts.TLS.clientConfig(e)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Refresh <= 0 {
		opts.Refresh = time.Minute
	}
	conn, err := grpc.NewClient(e.target(),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(serviceConfig))
	if err != nil {
		return nil, err
	}
	return &Client{
		name: name, endpoint: e, opts: opts, conn: conn,
		identity: providerv1.NewIdentityServiceClient(conn),
		machines: providerv1.NewMachineServiceClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the client's connection, for calls the Actuator methods do not
// make (the conformance suite sends malformed requests through it).
func (c *Client) Conn() grpc.ClientConnInterface { return c.conn }

// Endpoint is where the provider is reached.
func (c *Client) Endpoint() Endpoint { return c.endpoint }

func (c *Client) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.opts.Timeout)
}

// Capabilities returns what the provider declared, asking it when the
// last answer is older than the refresh interval; concurrent callers share
// one question. It also checks that the endpoint serves the provider this
// Client was made for.
func (c *Client) Capabilities(ctx context.Context) (*providerv1.GetCapabilitiesResponse, error) {
	c.mu.Lock()
	if c.caps != nil && time.Since(c.checked) < c.opts.Refresh {
		caps := c.caps
		c.mu.Unlock()
		return caps, nil
	}
	c.mu.Unlock()
	caps, err, _ := c.asking.Do("capabilities", func() (any, error) { return c.ask(ctx) })
	if err != nil {
		return nil, err
	}
	return caps.(*providerv1.GetCapabilitiesResponse), nil
}

func (c *Client) ask(ctx context.Context) (*providerv1.GetCapabilitiesResponse, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	name := c.Name()
	info, err := c.identity.GetInfo(ctx, &providerv1.GetInfoRequest{})
	if err != nil {
		return nil, fromStatus(c.who(), "GetInfo", err)
	}
	if name != "" && info.GetName() != name {
		// A wrong socket or address: wait, as for a provider that is
		// not there, rather than let another provider act.
		return nil, providers.Unavailable(fmt.Errorf("provider %s: %s serves provider %q instead", name, c.endpoint, info.GetName()))
	}
	if info.GetProtocol() != Protocol {
		return nil, providers.Unavailable(fmt.Errorf("provider %s at %s speaks protocol %q, not %q", info.GetName(), c.endpoint, info.GetProtocol(), Protocol))
	}
	caps, err := c.identity.GetCapabilities(ctx, &providerv1.GetCapabilitiesRequest{})
	if err != nil {
		return nil, fromStatus(info.GetName(), "GetCapabilities", err)
	}
	c.mu.Lock()
	c.name, c.caps, c.checked = info.GetName(), caps, time.Now()
	c.mu.Unlock()
	return caps, nil
}

// Name is the provider's name: the one Dial was given, or, dialled
// without one, what the provider said once asked.
func (c *Client) Name() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.name
}

// who names the provider in messages.
func (c *Client) who() string {
	if name := c.Name(); name != "" {
		return name
	}
	return "at " + c.endpoint.String()
}

// Probe asks whether the provider is ready.
func (c *Client) Probe(ctx context.Context) (*providerv1.ProbeResponse, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.identity.Probe(ctx, &providerv1.ProbeRequest{})
	return resp, fromStatus(c.who(), "Probe", err)
}

// Ping says whether the provider answers, is the one the client expects,
// and is ready: nil only then. It is what machinist_provider_up reports.
func (c *Client) Ping(ctx context.Context) error {
	if _, err := c.Capabilities(ctx); err != nil {
		return err
	}
	resp, err := c.Probe(ctx)
	if err != nil {
		return err
	}
	if !resp.GetReady() {
		return fmt.Errorf("provider %s is not ready: %s", c.who(), resp.GetMessage())
	}
	return nil
}

// Info returns the provider's identity.
func (c *Client) Info(ctx context.Context) (*providerv1.GetInfoResponse, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.identity.GetInfo(ctx, &providerv1.GetInfoRequest{})
	return resp, fromStatus(c.who(), "GetInfo", err)
}

// Create sends the Machine and its class as JSON, with the join data.
func (c *Client) Create(ctx context.Context, m *machinistv1.Machine, class *machinistv1.MachineClass, join providers.Join) (string, error) {
	if _, err := c.Capabilities(ctx); err != nil {
		return "", err
	}
	req := &providerv1.CreateRequest{MachineUid: string(m.UID), Join: joinToWire(join)}
	var err error
	if req.Machine, err = marshal(m, "Machine"); err != nil {
		return "", providers.Permanent(err)
	}
	if class != nil {
		if req.MachineClass, err = marshal(class, "MachineClass"); err != nil {
			return "", providers.Permanent(err)
		}
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.machines.Create(ctx, req)
	if err != nil {
		return "", fromStatus(c.who(), "Create", err)
	}
	return resp.GetProviderId(), nil
}

// marshal writes obj as kube-apiserver would serve it, with its apiVersion
// and kind, which objects from a typed client leave empty.
func marshal(obj any, kind string) ([]byte, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	fields["apiVersion"] = machinistv1.GroupVersion.String()
	fields["kind"] = kind
	return json.Marshal(fields)
}

// Exists asks whether the instance exists.
func (c *Client) Exists(ctx context.Context, providerID string) (bool, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.machines.Exists(ctx, &providerv1.ExistsRequest{ProviderId: providerID})
	if err != nil {
		return false, fromStatus(c.who(), "Exists", err)
	}
	return resp.GetExists(), nil
}

// Describe asks what the provider knows of the instance now, its owner
// with the rest. A provider that does not implement it (UNIMPLEMENTED)
// cannot tell: a zero Instance, no error.
func (c *Client) Describe(ctx context.Context, providerID string) (providers.Instance, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.machines.Describe(ctx, &providerv1.DescribeRequest{ProviderId: providerID})
	if status.Code(err) == codes.Unimplemented {
		return providers.Instance{}, nil
	}
	if err != nil {
		return providers.Instance{}, fromStatus(c.who(), "Describe", err)
	}
	in := providers.Instance{BootID: resp.GetBootId()}
	if f := resp.GetJoinFailure(); f != nil {
		in.JoinFailure = providers.ReportedJoinFailure(f.GetReason(), f.GetMessage())
	}
	if o := resp.GetOwner(); o != nil {
		in.Owner = providers.Owner{Namespace: o.GetNamespace(), Name: o.GetName(), UID: types.UID(o.GetUid())}
	}
	for _, a := range resp.GetAddresses() {
		addr := corev1.NodeAddress{Type: corev1.NodeAddressType(a.GetType()), Address: a.GetAddress()}
		if err := providers.CheckAddress(addr); err != nil {
			return providers.Instance{}, fmt.Errorf("%s: Describe(%s): %w", c.who(), providerID, err)
		}
		in.Addresses = append(in.Addresses, addr)
	}
	switch resp.GetPower() {
	case providerv1.PowerState_POWER_STATE_ON:
		in.Power = providers.PowerOn
	case providerv1.PowerState_POWER_STATE_OFF:
		in.Power, in.BootID = providers.PowerOff, ""
	}
	return in, nil
}

// Delete destroys the instance.
func (c *Client) Delete(ctx context.Context, providerID string) error {
	ctx, cancel := c.call(ctx)
	defer cancel()
	_, err := c.machines.Delete(ctx, &providerv1.DeleteRequest{ProviderId: providerID})
	return fromStatus(c.who(), "Delete", err)
}

// FindByUID asks for the instance made for a Machine.
func (c *Client) FindByUID(ctx context.Context, uid types.UID) (string, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.machines.FindByUID(ctx, &providerv1.FindByUIDRequest{MachineUid: string(uid)})
	if err != nil {
		return "", fromStatus(c.who(), "FindByUID", err)
	}
	return resp.GetProviderId(), nil
}

// List asks for every instance the provider holds. A provider that does
// not serve List (UNIMPLEMENTED) cannot list: ErrNoList.
func (c *Client) List(ctx context.Context) ([]providers.Listed, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.machines.List(ctx, &providerv1.ListRequest{})
	if status.Code(err) == codes.Unimplemented {
		return nil, providers.ErrNoList
	}
	if err != nil {
		return nil, fromStatus(c.who(), "List", err)
	}
	out := make([]providers.Listed, 0, len(resp.GetInstances()))
	for _, in := range resp.GetInstances() {
		if in.GetProviderId() == "" {
			return nil, fmt.Errorf("provider %s listed an instance without a provider ID", c.who())
		}
		l := providers.Listed{ProviderID: in.GetProviderId()}
		if o := in.GetOwner(); o != nil {
			l.Owner = providers.Owner{Namespace: o.GetNamespace(), Name: o.GetName(), UID: types.UID(o.GetUid())}
		}
		out = append(out, l)
	}
	return out, nil
}

// ErrNotDeclared is wrapped by the (permanent) error for a verb the
// provider did not declare.
var ErrNotDeclared = errors.New("the provider does not declare this verb")

// declared refuses, without a call, a verb the provider did not declare.
func (c *Client) declared(ctx context.Context, verb providerv1.Verb) error {
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(caps.GetVerbs(), verb) {
		return providers.Permanent(fmt.Errorf("provider %s cannot %s machines: %w", c.who(), verbName(verb), ErrNotDeclared))
	}
	return nil
}

// Reboot asks for a reboot, once per op.ID.
func (c *Client) Reboot(ctx context.Context, providerID string, op providers.Operation) error {
	if err := c.declared(ctx, VerbReboot); err != nil {
		return err
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	_, err := c.machines.Reboot(ctx, &providerv1.RebootRequest{ProviderId: providerID, OperationId: op.ID, Hard: op.Hard})
	return fromStatus(c.who(), "Reboot", err)
}

// Repair asks for a repair, once per op.ID, with op.Join.
func (c *Client) Repair(ctx context.Context, providerID string, op providers.Operation) error {
	if err := c.declared(ctx, VerbRepair); err != nil {
		return err
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	_, err := c.machines.Repair(ctx, &providerv1.RepairRequest{ProviderId: providerID, OperationId: op.ID, Join: joinToWire(op.Join)})
	return fromStatus(c.who(), "Repair", err)
}

// Update asks for an in-place update to op.Version, once per op.ID.
func (c *Client) Update(ctx context.Context, providerID string, op providers.Operation) error {
	if err := c.declared(ctx, VerbUpdate); err != nil {
		return err
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	_, err := c.machines.Update(ctx, &providerv1.UpdateRequest{ProviderId: providerID, OperationId: op.ID, Version: op.Version})
	return fromStatus(c.who(), "Update", err)
}

// InPlace answers from the declared capabilities. While the provider
// cannot be asked, its last answer stands (a short outage must not turn an
// in-place rollout into replacements); a provider never reached is taken to
// update nothing in place, and a rollout then waits or replaces, as its
// strategy's fallback says.
func (c *Client) InPlace(change providers.Change) bool {
	if change.Empty() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	caps, err := c.Capabilities(ctx)
	if err != nil {
		c.mu.Lock()
		caps = c.caps
		c.mu.Unlock()
	}
	if caps == nil || !slices.Contains(caps.GetVerbs(), VerbUpdate) {
		return false
	}
	in := caps.GetInPlace()
	if change.Version && !slices.Contains(in, providerv1.Change_CHANGE_VERSION) {
		return false
	}
	if change.Class && !slices.Contains(in, providerv1.Change_CHANGE_CLASS) {
		return false
	}
	return true
}

// joinToWire is join as the protocol carries it; a zero Join is no
// message at all, which the provider refuses.
func joinToWire(j providers.Join) *providerv1.Join {
	if j.IsZero() {
		return nil
	}
	return &providerv1.Join{Server: j.Server, CaData: j.CAData, Token: j.Token}
}

// joinFromWire is the inverse of joinToWire.
func joinFromWire(j *providerv1.Join) providers.Join {
	return providers.Join{Server: j.GetServer(), CAData: j.GetCaData(), Token: j.GetToken()}
}
