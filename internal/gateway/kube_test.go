package gateway

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

func slice(name, service string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "cell", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("metrics"), Port: ptr.To[int32](9090)}, {Name: ptr.To("http"), Port: ptr.To(port)}},
		Endpoints:   eps,
	}
}

func endpoint(ip, pod string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: "cell"},
	}
}

// TestEndpointSlices runs the informer against client-go's fake clientset:
// the service's endpoints are found (not-ready ones too: a draining host
// still holds sessions), by the named port, and changes arrive.
func TestEndpointSlices(t *testing.T) {
	client := fake.NewClientset(
		slice("hosts-a", "sandloop-hosts", 8080, endpoint("10.0.0.1", "host-0", true), endpoint("10.0.0.2", "host-1", false)),
		slice("other", "something-else", 8080, endpoint("10.9.9.9", "x-0", true)),
	)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	d, err := NewEndpointSlices(ctx, client, "cell", "sandloop-hosts", "http")
	if err != nil {
		t.Fatal(err)
	}
	want := "[{host-0 http://10.0.0.1:8080 false []} {host-1 http://10.0.0.2:8080 false []}]"
	if got := fmt.Sprint(d.Targets()); got != want {
		t.Errorf("targets = %s, want %s", got, want)
	}

	// A scale-up adds a slice; a pod replaced under the same name moves.
	_, err = client.DiscoveryV1().EndpointSlices("cell").Create(ctx,
		slice("hosts-b", "sandloop-hosts", 8080, endpoint("10.0.0.3", "host-2", true)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.DiscoveryV1().EndpointSlices("cell").Update(ctx,
		slice("hosts-a", "sandloop-hosts", 8080, endpoint("10.0.0.7", "host-0", true)), metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want = "[{host-0 http://10.0.0.7:8080 false []} {host-2 http://10.0.0.3:8080 false []}]"
	testutil.WaitFor(t, 10*time.Second, func() error {
		if got := fmt.Sprint(d.Targets()); got != want {
			return fmt.Errorf("targets = %s, want %s", got, want)
		}
		return nil
	})
}

func TestEndpointSlicesListFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	client := fake.NewClientset()
	client.PrependReactor("list", "endpointslices", func(a ktesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("forbidden")
	})
	if _, err := NewEndpointSlices(ctx, client, "cell", "sandloop-hosts", ""); err == nil {
		t.Error("no error when the slices cannot be listed")
	}
}

func TestParseStatic(t *testing.T) {
	s, err := ParseStatic(" http://10.0.0.1:8080, https://h2:9/ ,")
	if err != nil || fmt.Sprint(s) != "[{10.0.0.1:8080 http://10.0.0.1:8080 false []} {h2:9 https://h2:9 false []}]" {
		t.Errorf("got %v, %v", s, err)
	}
	for _, bad := range []string{"", "10.0.0.1:8080", "http://a:1/path", "ftp://a:1", "http://a:1,http://a:1"} {
		if _, err := ParseStatic(bad); err == nil {
			t.Errorf("ParseStatic(%q) accepted", bad)
		}
	}
}
