package kube

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kv1 "github.com/molt-sh/molt/api/kube/v1alpha1"
)

func TestPick(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	fresh := metav1.NewTime(now.Add(-time.Second))
	stale := metav1.NewTime(now.Add(-time.Minute))
	node := func(name string, capacity int32, hb *metav1.Time, cks ...string) kv1.MoltNode {
		return kv1.MoltNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kv1.MoltNodeSpec{Capacity: capacity},
			Status: kv1.MoltNodeStatus{HeartbeatTime: hb, Checkpoints: cks}}
	}
	cordoned := node("c", 10, &fresh, "ck1")
	cordoned.Spec.Unschedulable = true
	const timeout = 30 * time.Second
	for _, tc := range []struct {
		name  string
		nodes []kv1.MoltNode
		bound map[string]int
		p     placement
		want  string
	}{
		{"the most room", []kv1.MoltNode{node("a", 4, &fresh), node("b", 4, &fresh)}, map[string]int{"a": 2, "b": 1}, placement{}, "b"},
		{"a tie goes by name", []kv1.MoltNode{node("b", 4, &fresh), node("a", 4, &fresh)}, nil, placement{}, "a"},
		{"full", []kv1.MoltNode{node("a", 2, &fresh), node("b", 1, &fresh)}, map[string]int{"a": 2, "b": 1}, placement{}, ""},
		{"stale", []kv1.MoltNode{node("a", 4, &stale), node("b", 1, &fresh)}, nil, placement{}, "b"},
		{"never heard from", []kv1.MoltNode{node("a", 4, nil)}, nil, placement{}, ""},
		{"unschedulable", []kv1.MoltNode{cordoned, node("b", 1, &fresh)}, nil, placement{checkpoint: "ck1"}, "b"},
		{"holding beats room", []kv1.MoltNode{node("a", 4, &fresh, "ck1"), node("b", 40, &fresh)}, map[string]int{"a": 3}, placement{checkpoint: "ck1"}, "a"},
		{"holding preferred, not required", []kv1.MoltNode{node("a", 4, &fresh, "ck1"), node("b", 4, &fresh)}, map[string]int{"a": 4}, placement{checkpoint: "ck1"}, "b"},
		{"holding required", []kv1.MoltNode{node("a", 4, &fresh, "ck1"), node("b", 4, &fresh)}, map[string]int{"a": 4}, placement{checkpoint: "ck1", required: true}, ""},
		{"required and held", []kv1.MoltNode{node("a", 4, &fresh), node("b", 4, &fresh, "ck2", "ck1")}, nil, placement{checkpoint: "ck1", required: true}, "b"},
	} {
		got, why := Pick(tc.nodes, tc.bound, tc.p, now, timeout)
		if got != tc.want {
			t.Errorf("%s: picked %q (%s), want %q", tc.name, got, why, tc.want)
		}
		if got == "" && why == "" {
			t.Errorf("%s: no node and no reason", tc.name)
		}
	}
}

func TestSchedulerReconcile(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	hb := metav1.NewTime(now)
	past := metav1.NewTime(now.Add(-time.Minute))
	sb := func(name string, fn func(*kv1.Sandbox)) *kv1.Sandbox {
		s := &kv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: kv1.SandboxSpec{Image: "debian", OperatingMode: kv1.Running}}
		fn(s)
		return s
	}
	objs := []client.Object{
		&kv1.MoltNode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: kv1.MoltNodeSpec{Capacity: 1}, Status: kv1.MoltNodeStatus{HeartbeatTime: &hb}},
		sb("new", func(*kv1.Sandbox) {}),
		sb("second", func(*kv1.Sandbox) {}),
		sb("suspended", func(s *kv1.Sandbox) {
			s.Labels = map[string]string{kv1.NodeLabel: "n1"}
			s.Spec.OperatingMode = kv1.Suspended
			s.Status = kv1.SandboxStatus{Phase: kv1.SandboxSuspended, Offloaded: true, SandboxID: "abc", NodeName: "n1"}
		}),
		sb("expired", func(s *kv1.Sandbox) {
			s.Spec.Lifecycle = kv1.Lifecycle{ShutdownTime: &past, ShutdownPolicy: kv1.ShutdownDelete}
		}),
	}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).WithStatusSubresource(&kv1.Sandbox{}, &kv1.MoltNode{}).Build()
	s := &Scheduler{Client: c, Heartbeat: time.Second, Now: func() time.Time { return now }}
	rec := func(name string) reconcile.Result {
		t.Helper()
		res, err := s.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}})
		if err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
		return res
	}
	get := func(name string) *kv1.Sandbox {
		t.Helper()
		var out kv1.Sandbox
		if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: name}, &out); err != nil {
			t.Fatalf("get %s: %v", name, err)
		}
		return &out
	}
	// The suspended one, in the store, is unbound first: it frees n1's
	// one place.
	rec("suspended")
	if got := get("suspended"); got.Labels[kv1.NodeLabel] != "" || apimeta.IsStatusConditionTrue(got.Status.Conditions, CondScheduled) {
		t.Fatalf("suspended and offloaded: labels %v, conditions %v", got.Labels, got.Status.Conditions)
	}
	rec("new")
	if got := get("new"); got.Labels[kv1.NodeLabel] != "n1" || !apimeta.IsStatusConditionTrue(got.Status.Conditions, CondScheduled) {
		t.Fatalf("new: labels %v, conditions %v", got.Labels, got.Status.Conditions)
	}
	// n1 is full now.
	if res := rec("second"); res.RequeueAfter == 0 {
		t.Fatal("an unschedulable sandbox is not looked at again")
	}
	got := get("second")
	if got.Labels[kv1.NodeLabel] != "" || apimeta.FindStatusCondition(got.Status.Conditions, CondScheduled).Reason != ReasonUnschedulable || got.Status.Phase != kv1.SandboxPending {
		t.Fatalf("second: labels %v, status %+v", got.Labels, got.Status)
	}
	// Expired with policy Delete: deleted.
	rec("expired")
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "expired"}, &kv1.Sandbox{}); !apierrors.IsNotFound(err) {
		t.Fatalf("expired with policy Delete: %v", err)
	}
}
