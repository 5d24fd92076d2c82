// Package helm holds the Helm chart's test: the chart is rendered by
// Helm's own engine (helm.sh/helm/v4/pkg/engine, as `helm template` does)
// and every object must decode strictly into the k8s.io/api types: an
// unknown or misplaced field fails.
package helm

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// render renders the chart with Helm's own engine (as `helm template`
// does), its values.yaml overlaid by overrides.
func render(t *testing.T, overrides map[string]any) []string {
	t.Helper()
	chrt, err := loader.Load("sandloop")
	if err != nil {
		t.Fatal(err)
	}
	vals, err := util.ToRenderValues(chrt, overrides, common.ReleaseOptions{Name: "cell", Namespace: "sandbox", IsInstall: true}, common.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(chrt, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	var docs []string
	for _, name := range names {
		if strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		for _, d := range strings.Split(out[name], "\n---") {
			if strings.TrimSpace(stripComments(d)) != "" {
				docs = append(docs, d)
			}
		}
	}
	return docs
}

func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// decode turns one rendered document into its typed object, strictly.
func decode(doc string) (any, error) {
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return nil, err
	}
	var meta struct{ APIVersion, Kind string }
	if err := json.Unmarshal(j, &meta); err != nil {
		return nil, err
	}
	var obj any
	switch meta.APIVersion + "/" + meta.Kind {
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "v1/ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2/HorizontalPodAutoscaler":
		obj = &autoscalingv2.HorizontalPodAutoscaler{}
	case "networking.k8s.io/v1/NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "rbac.authorization.k8s.io/v1/Role":
		obj = &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		obj = &rbacv1.RoleBinding{}
	default:
		return nil, fmt.Errorf("unexpected object %s %s", meta.APIVersion, meta.Kind)
	}
	// As the API server decodes: case-sensitive, unknown and duplicate fields refused.
	strict, err := kjson.UnmarshalStrict(j, obj)
	if err == nil && len(strict) > 0 {
		err = errors.Join(strict...)
	}
	return obj, err
}

func TestStrictDecodeRefusesUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  clusterIp: None\n",       // wrong case
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  hostUsers: false\n",      // misplaced
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: two\n", // wrong type
	} {
		if _, err := decode(doc); err == nil {
			t.Errorf("decoded:\n%s", doc)
		}
	}
}

func TestChartRendersAndDecodes(t *testing.T) {
	objs := map[string]any{}
	for _, doc := range render(t, nil) {
		obj, err := decode(doc)
		if err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		j, _ := json.Marshal(obj)
		var m struct {
			Metadata struct{ Name string }
		}
		json.Unmarshal(j, &m)
		objs[fmt.Sprintf("%T/%s", obj, m.Metadata.Name)] = obj
	}
	host, ok := objs["*v1.Deployment/cell-host"].(*appsv1.Deployment)
	if !ok {
		t.Fatalf("no host Deployment among %v", keys(objs))
	}
	pod := host.Spec.Template.Spec
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case pod.HostUsers == nil || *pod.HostUsers:
		t.Error("host pods must run in a user namespace (hostUsers: false)")
	case sc.ProcMount == nil || *sc.ProcMount != corev1.UnmaskedProcMount:
		t.Error("procMount must be Unmasked")
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost || *sc.SeccompProfile.LocalhostProfile != "sandloop.json":
		t.Error("a Localhost seccomp profile is required")
	case sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != corev1.AppArmorProfileTypeLocalhost:
		t.Error("a Localhost AppArmor profile is required")
	case sc.Capabilities != nil && len(sc.Capabilities.Add) > 0, sc.Privileged != nil && *sc.Privileged:
		t.Error("no capability may be added, nor privilege")
	case pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds != 615:
		t.Errorf("grace period %v: must cover --drain-timeout", pod.TerminationGracePeriodSeconds)
	case c.StartupProbe == nil || c.StartupProbe.HTTPGet == nil || c.StartupProbe.HTTPGet.Path != "/healthz" || c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold < 300:
		// Its sessions restored before it answers: the liveness probe
		// (a minute) must not kill a restart that takes longer.
		t.Errorf("startup probe %+v: a restarted host needs minutes to restore its sessions", c.StartupProbe)
	}
	if lim := c.Resources.Limits.Memory().Value(); lim != (32*512+512)<<20 {
		t.Errorf("memory limit %d: sessions x memory per session + overhead", lim)
	}
	envs := fmt.Sprint(c.Env)
	if !strings.Contains(envs, "SANDLOOP_DATABASE_URL") || !strings.Contains(envs, "sandloop-database") || !strings.Contains(envs, "SANDLOOP_GATEWAY_SECRET") {
		t.Errorf("secrets not wired: %s", envs)
	}
	svc := objs["*v1.Service/cell-hosts"].(*corev1.Service)
	if svc.Spec.ClusterIP != "None" || !svc.Spec.PublishNotReadyAddresses {
		t.Error("the hosts' Service must be headless and list draining hosts")
	}
	np := objs["*v1.NetworkPolicy/cell-host"].(*networkingv1.NetworkPolicy)
	if from := np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/component"]; from != "gateway" || len(np.Spec.Ingress) != 1 {
		t.Errorf("hosts must be reachable only from gateways: %+v", np.Spec.Ingress)
	}
	hpa := objs["*v2.HorizontalPodAutoscaler/cell-host"].(*autoscalingv2.HorizontalPodAutoscaler)
	if hpa.Spec.Metrics[0].Pods.Metric.Name != "sandloop_session_slots_used_ratio" || hpa.Spec.ScaleTargetRef.Name != "cell-host" {
		t.Errorf("hpa: %+v", hpa.Spec)
	}
	gw := objs["*v1.Deployment/cell-gateway"].(*appsv1.Deployment)
	if args := strings.Join(gw.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--kube-service=cell-hosts") {
		t.Errorf("gateway args: %s", args)
	}
	for _, k := range []string{"*v1.PodDisruptionBudget/cell-host", "*v1.Role/cell-gateway", "*v1.RoleBinding/cell-gateway", "*v1.Service/cell-gateway", "*v1.ServiceAccount/cell-gateway"} {
		if objs[k] == nil {
			t.Errorf("missing %s", k)
		}
	}

	// Without a snapshot store, none is named; with one, the hosts write
	// to it (and read its keys from the Secret).
	if args := strings.Join(c.Args, " "); strings.Contains(args, "--snapshot") || c.EnvFrom != nil {
		t.Errorf("host args without a snapshot store: %s %v", args, c.EnvFrom)
	}
	for _, doc := range render(t, map[string]any{"snapshots": map[string]any{"store": "s3://s3.cell.invalid/snaps/cell", "existingSecret": "snap-keys", "every": "15s"}}) {
		obj, err := decode(doc)
		if err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		if d, ok := obj.(*appsv1.Deployment); ok && d.Name == "cell-host" {
			c := d.Spec.Template.Spec.Containers[0]
			args := strings.Join(c.Args, " ")
			if !strings.Contains(args, "--snapshot-store=s3://s3.cell.invalid/snaps/cell") || !strings.Contains(args, "--snapshot-every=15s") ||
				len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != "snap-keys" {
				t.Errorf("host with a snapshot store: args %s, envFrom %+v", args, c.EnvFrom)
			}
		}
	}

	// Autoscaling off: no HPA rendered.
	for _, doc := range render(t, map[string]any{"host": map[string]any{"autoscaling": map[string]any{"enabled": false}}}) {
		if strings.Contains(doc, "HorizontalPodAutoscaler") {
			t.Error("an HPA with autoscaling disabled")
		}
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
