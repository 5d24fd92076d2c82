package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	typed "k8s.io/client-go/kubernetes/typed/discovery/v1"
	listers "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// EndpointSlices finds hosts through the EndpointSlices of a Kubernetes
// Service (headless, with publishNotReadyAddresses: a draining host is not
// ready, yet the gateways must still reach its sessions; they check
// readiness themselves). An informer keeps a cached view; Targets reads it.
type EndpointSlices struct {
	lister   listers.EndpointSliceNamespaceLister
	selector labels.Selector
	port     string
}

// NewEndpointSlices starts watching the slices of service in namespace and
// returns once the first list has arrived. port names the Service's port
// to dial ("" for the first one). It stops when ctx ends. Only the
// discovery/v1 client is used: a clientset, or DiscoveryOnly.
func NewEndpointSlices(ctx context.Context, clientset DiscoveryClientset, namespace, service, port string) (*EndpointSlices, error) {
	client := clientset.DiscoveryV1()
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service})
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel.String()
			return client.EndpointSlices(namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel.String()
			return client.EndpointSlices(namespace).Watch(ctx, o)
		},
	}
	// A client that cannot stream lists (client-go's fake) says so; the
	// reflector then lists and watches the classic way.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, clientset), &discoveryv1.EndpointSlice{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("list the EndpointSlices of service %s/%s: %w", namespace, service, context.Cause(ctx))
	}
	return &EndpointSlices{lister: listers.NewEndpointSliceLister(inf.GetIndexer()).EndpointSlices(namespace), selector: sel, port: port}, nil
}

// DiscoveryClientset is the part of a clientset discovery uses.
type DiscoveryClientset interface {
	DiscoveryV1() typed.DiscoveryV1Interface
}

// DiscoveryOnly makes a clientset of the discovery/v1 client alone, so the
// binary does not carry every API group's client.
type DiscoveryOnly struct{ *typed.DiscoveryV1Client }

// DiscoveryV1 returns the client.
func (d DiscoveryOnly) DiscoveryV1() typed.DiscoveryV1Interface { return d.DiscoveryV1Client }

// Targets lists every endpoint of the service, ready or not, named by its
// pod (so a restarted pod keeps its name) or else its address.
func (e *EndpointSlices) Targets() []Target {
	slices, err := e.lister.List(e.selector)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []Target
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port, ok := slicePort(s, e.port)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			addr := net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port)))
			name := addr
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" && ep.TargetRef.Name != "" {
				name = ep.TargetRef.Name
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			out = append(out, Target{Name: name, URL: "http://" + addr})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func slicePort(s *discoveryv1.EndpointSlice, name string) (int32, bool) {
	for _, p := range s.Ports {
		if p.Port != nil && (name == "" || (p.Name != nil && *p.Name == name)) {
			return *p.Port, true
		}
	}
	return 0, false
}

// ErrNoNamespace: InCluster was given a service without a namespace and
// found none in the pod.
var ErrNoNamespace = errors.New("no namespace (give NAMESPACE/NAME or set POD_NAMESPACE)")

// InCluster watches the EndpointSlices of service (NAME in the pod's
// namespace: $POD_NAMESPACE, else the service account's; or
// NAMESPACE/NAME) with the pod's service account.
func InCluster(ctx context.Context, service, port string) (*EndpointSlices, error) {
	ns, name, ok := strings.Cut(service, "/")
	if !ok {
		name = service
		ns = os.Getenv("POD_NAMESPACE")
		if ns == "" {
			b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
			if err != nil {
				return nil, fmt.Errorf("service %s: %w", service, ErrNoNamespace)
			}
			ns = strings.TrimSpace(string(b))
		}
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("the pod's service account (this must run inside Kubernetes): %w", err)
	}
	client, err := typed.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return NewEndpointSlices(ctx, DiscoveryOnly{DiscoveryV1Client: client}, ns, name, port)
}
