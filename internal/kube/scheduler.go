// Package kube runs molt sandboxes as Kubernetes resources (api/kube):
// the controller (Scheduler: places sandboxes on nodes, frees suspended
// ones, expires them) and the node agent (Agent: makes each resource
// bound to its node true on its molt daemon, and reports the node).
// docs/kubernetes.md describes the design and the deployment.
package kube

import (
	"cmp"
	"context"
	"fmt"
	"k8s.io/client-go/tools/events"
	"slices"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kv1 "github.com/molt-sh/molt/api/kube/v1alpha1"
)

// Condition types and reasons.
const (
	CondScheduled = "Scheduled"
	CondReady     = "Ready"

	ReasonBound         = "Bound"
	ReasonUnschedulable = "Unschedulable"
	ReasonSuspended     = "Suspended"
	ReasonWaiting       = "WaitingForCheckpoint"
	ReasonRemoving      = "Removing"
)

// HeartbeatTimeout is how long a node agent may go unheard before its
// node gets no new sandboxes: three heartbeats.
func HeartbeatTimeout(interval time.Duration) time.Duration { return 3 * interval }

// Scheduler is the controller's reconciler of Sandboxes: it binds each
// sandbox that should run and runs nowhere to a node (NodeLabel), by
// capacity and by where the checkpoint it starts from is held; it
// unbinds a suspended sandbox once it is in the object store, so that
// it resumes anywhere; it deletes an expired sandbox whose policy says
// so; and it hands an unbound sandbox that must be removed to a node.
type Scheduler struct {
	Client client.Client
	// Heartbeat is the node agents' heartbeat interval.
	Heartbeat time.Duration
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
	// Events records what the controller did as Kubernetes Events (nil:
	// none).
	Events events.EventRecorder
}

func (s *Scheduler) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// SetupWithManager registers the scheduler: it acts on Sandboxes, and
// looks again at the unbound ones when a node or a checkpoint changes.
func (s *Scheduler) SetupWithManager(mgr ctrl.Manager) error {
	if s.Heartbeat <= 0 {
		s.Heartbeat = DefaultHeartbeat
	}
	unbound := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var l kv1.SandboxList
		if err := s.Client.List(ctx, &l); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for _, sb := range l.Items {
			if sb.Labels[kv1.NodeLabel] == "" {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}})
			}
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("molt-scheduler").
		For(&kv1.Sandbox{}).
		Watches(&kv1.MoltNode{}, unbound).
		Watches(&kv1.SandboxCheckpoint{}, unbound).
		Complete(s)
}

// Reconcile looks at one Sandbox.
func (s *Scheduler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sb kv1.Sandbox
	if err := s.Client.Get(ctx, req.NamespacedName, &sb); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	node := sb.Labels[kv1.NodeLabel]
	now := s.now()
	expired := sb.Spec.Lifecycle.ShutdownTime != nil && !now.Before(sb.Spec.Lifecycle.ShutdownTime.Time)
	switch {
	case sb.DeletionTimestamp != nil:
		if node != "" || !controllerutil.ContainsFinalizer(&sb, kv1.SandboxFinalizer) {
			return reconcile.Result{}, nil // its node agent removes it
		}
		if sb.Status.SandboxID == "" {
			// Never made anywhere: nothing to remove.
			controllerutil.RemoveFinalizer(&sb, kv1.SandboxFinalizer)
			return reconcile.Result{}, s.Client.Update(ctx, &sb)
		}
		return s.bindForRemoval(ctx, &sb)
	case expired && sb.Spec.Lifecycle.ShutdownPolicy == kv1.ShutdownDelete:
		return reconcile.Result{}, client.IgnoreNotFound(s.Client.Delete(ctx, &sb))
	case expired:
		if node != "" || sb.Status.SandboxID == "" {
			return reconcile.Result{}, nil
		}
		return s.bindForRemoval(ctx, &sb)
	case node != "":
		if sb.Spec.OperatingMode == kv1.Suspended && sb.Status.Phase == kv1.SandboxSuspended && sb.Status.Offloaded {
			return reconcile.Result{}, s.unbind(ctx, &sb)
		}
		return s.requeueAtExpiry(&sb, now), nil
	case sb.Spec.OperatingMode == kv1.Suspended:
		return s.requeueAtExpiry(&sb, now), nil
	}
	return s.schedule(ctx, &sb, now)
}

// requeueAtExpiry looks at sb again when it expires.
func (s *Scheduler) requeueAtExpiry(sb *kv1.Sandbox, now time.Time) reconcile.Result {
	if t := sb.Spec.Lifecycle.ShutdownTime; t != nil {
		return reconcile.Result{RequeueAfter: t.Sub(now) + 10*time.Millisecond}
	}
	return reconcile.Result{}
}

// placement is what a sandbox needs of a node: the molt checkpoint it
// starts from (a fork: required to be held there; a resume: preferred).
type placement struct {
	checkpoint string
	required   bool
}

func (s *Scheduler) placementOf(ctx context.Context, sb *kv1.Sandbox) (placement, string, error) {
	if src := sb.Spec.Source; src != nil && sb.Status.SandboxID == "" {
		var ck kv1.SandboxCheckpoint
		err := s.Client.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: src.CheckpointName}, &ck)
		if err != nil {
			return placement{}, fmt.Sprintf("checkpoint %s: %v", src.CheckpointName, client.IgnoreNotFound(err)), client.IgnoreNotFound(err)
		}
		if ck.Status.Phase != kv1.OperationSucceeded {
			return placement{}, fmt.Sprintf("checkpoint %s is not taken yet", src.CheckpointName), nil
		}
		return placement{checkpoint: ck.Status.CheckpointID, required: true}, "", nil
	}
	return placement{checkpoint: sb.Status.Head}, "", nil
}

// Pick chooses the node for a sandbox among nodes, given how many
// sandboxes each has bound: a node heard from within the timeout, not
// unschedulable, with room; holding the checkpoint if required; then
// the one holding it, then the one with the most room, then by name.
// It returns "" and why when none fits.
func Pick(nodes []kv1.MoltNode, bound map[string]int, p placement, now time.Time, timeout time.Duration) (string, string) {
	type cand struct {
		name  string
		holds bool
		room  int
	}
	var cs []cand
	why := "no MoltNode"
	for _, n := range nodes {
		hb := n.Status.HeartbeatTime
		switch {
		case n.Spec.Unschedulable:
			why = "every node is unschedulable, stale or full"
			continue
		case hb == nil || now.Sub(hb.Time) > timeout:
			why = "every node is unschedulable, stale or full"
			continue
		}
		room := int(n.Spec.Capacity) - bound[n.Name]
		if room <= 0 {
			why = "every node is unschedulable, stale or full"
			continue
		}
		holds := p.checkpoint != "" && slices.Contains(n.Status.Checkpoints, p.checkpoint)
		if p.required && !holds {
			why = fmt.Sprintf("no node with room holds checkpoint %s", p.checkpoint)
			continue
		}
		cs = append(cs, cand{n.Name, holds, room})
	}
	if len(cs) == 0 {
		return "", why
	}
	best := slices.MinFunc(cs, func(a, b cand) int {
		if a.holds != b.holds {
			if a.holds {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.room, a.room); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	return best.name, ""
}

// bound counts the sandboxes bound to each node.
func (s *Scheduler) bound(ctx context.Context) (map[string]int, error) {
	var l kv1.SandboxList
	if err := s.Client.List(ctx, &l); err != nil {
		return nil, err
	}
	m := map[string]int{}
	for _, sb := range l.Items {
		if n := sb.Labels[kv1.NodeLabel]; n != "" {
			m[n]++
		}
	}
	return m, nil
}

func (s *Scheduler) schedule(ctx context.Context, sb *kv1.Sandbox, now time.Time) (reconcile.Result, error) {
	p, waiting, err := s.placementOf(ctx, sb)
	if err != nil {
		return reconcile.Result{}, err
	}
	if waiting != "" {
		return reconcile.Result{RequeueAfter: 5 * time.Second}, s.setScheduled(ctx, sb, metav1.ConditionFalse, ReasonWaiting, waiting)
	}
	var nodes kv1.MoltNodeList
	if err := s.Client.List(ctx, &nodes); err != nil {
		return reconcile.Result{}, err
	}
	bound, err := s.bound(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	node, why := Pick(nodes.Items, bound, p, now, HeartbeatTimeout(s.Heartbeat))
	if node == "" {
		return reconcile.Result{RequeueAfter: 5 * time.Second}, s.setScheduled(ctx, sb, metav1.ConditionFalse, ReasonUnschedulable, why)
	}
	if err := s.bind(ctx, sb, node); err != nil {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).Info("bound", "node", node, "checkpoint", p.checkpoint)
	note := "bound to node " + node
	if p.checkpoint != "" {
		note += ", which holds checkpoint " + p.checkpoint
	}
	emit(s.Events, sb, false, "Scheduled", "Bind", note)
	return reconcile.Result{}, s.setScheduled(ctx, sb, metav1.ConditionTrue, ReasonBound, "bound to "+node)
}

// bind sets the node label, only on the version of sb read (two
// reconciles cannot both bind it).
func (s *Scheduler) bind(ctx context.Context, sb *kv1.Sandbox, node string) error {
	old := sb.DeepCopy()
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	sb.Labels[kv1.NodeLabel] = node
	return s.Client.Patch(ctx, sb, client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{}))
}

func (s *Scheduler) unbind(ctx context.Context, sb *kv1.Sandbox) error {
	old := sb.DeepCopy()
	delete(sb.Labels, kv1.NodeLabel)
	if err := s.Client.Patch(ctx, sb, client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	emit(s.Events, sb, false, "Unbound", "Unbind", "in the object store; resumes on any node")
	return s.setScheduled(ctx, sb, metav1.ConditionFalse, ReasonSuspended, "in the object store; resumes on any node")
}

// bindForRemoval gives a sandbox that is in the store, bound to no node,
// to the node that last ran it (else any live node) to remove.
func (s *Scheduler) bindForRemoval(ctx context.Context, sb *kv1.Sandbox) (reconcile.Result, error) {
	var nodes kv1.MoltNodeList
	if err := s.Client.List(ctx, &nodes); err != nil {
		return reconcile.Result{}, err
	}
	timeout := HeartbeatTimeout(s.Heartbeat)
	live := func(n kv1.MoltNode) bool {
		return n.Status.HeartbeatTime != nil && s.now().Sub(n.Status.HeartbeatTime.Time) <= timeout
	}
	target := ""
	for _, n := range nodes.Items {
		if live(n) && (target == "" || n.Name == sb.Status.NodeName) {
			target = n.Name
		}
	}
	if target == "" {
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	if err := s.bind(ctx, sb, target); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, s.setScheduled(ctx, sb, metav1.ConditionTrue, ReasonRemoving, "bound to "+target+" to be removed")
}

func (s *Scheduler) setScheduled(ctx context.Context, sb *kv1.Sandbox, status metav1.ConditionStatus, reason, msg string) error {
	old := sb.DeepCopy()
	changed := apimeta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{
		Type: CondScheduled, Status: status, Reason: reason, Message: msg, ObservedGeneration: sb.Generation,
	})
	if sb.Status.Phase == "" {
		sb.Status.Phase = kv1.SandboxPending
		changed = true
	}
	if !changed {
		return nil
	}
	// With the lock: the node agent writes the same list (Ready).
	return client.IgnoreNotFound(s.Client.Status().Patch(ctx, sb, client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{})))
}
