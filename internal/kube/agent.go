package kube

import (
	"context"
	"errors"
	"fmt"
	"k8s.io/client-go/tools/events"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kv1 "github.com/molt-sh/molt/api/kube/v1alpha1"
	v1 "github.com/molt-sh/molt/api/v1"
)

// DefaultHeartbeat is the node agents' default heartbeat interval.
const DefaultHeartbeat = 10 * time.Second

// maxNodeCheckpoints bounds MoltNodeStatus.Checkpoints.
const maxNodeCheckpoints = 1024

// Daemon is what the node agent asks of its molt daemon (client.Client
// over the daemon's socket).
type Daemon interface {
	Create(ctx context.Context, req v1.SandboxCreateRequest) (v1.Sandbox, error)
	Sandbox(ctx context.Context, ref string) (v1.Sandbox, error)
	Sandboxes(ctx context.Context) ([]v1.Sandbox, error)
	Remove(ctx context.Context, ref string) error
	Checkpoint(ctx context.Context, ref string, req v1.CheckpointRequest) (v1.Checkpoint, error)
	Checkpoints(ctx context.Context, ref string) ([]v1.Checkpoint, error)
	CheckpointInfo(ctx context.Context, ref string) (v1.Checkpoint, error)
	RollbackWith(ctx context.Context, ref string, req v1.RollbackRequest) (v1.RollbackResult, error)
	ForkCheckpoint(ctx context.Context, checkpoint string, n int) (v1.ForkResult, error)
	HibernateOffload(ctx context.Context, ref string) (v1.Sandbox, error)
	Offload(ctx context.Context, ref string) (v1.Sandbox, error)
	Resume(ctx context.Context, ref string) (v1.Sandbox, error)
	DeleteCheckpoint(ctx context.Context, ref string) error
	Host(ctx context.Context) (v1.Host, error)
	TrustKey(ctx context.Context, publicKey string) (v1.TrustedKey, error)
}

// Agent is the node agent: one per node, next to the node's molt daemon.
// It acts only on the Sandboxes bound to its node (its manager's cache
// should hold no others: CacheOptions), and on the checkpoints and
// rollbacks of those; it keeps its MoltNode's status.
type Agent struct {
	Client client.Client
	Daemon Daemon
	// Node is this node's name (the MoltNode's and the label's value).
	Node string
	// Capacity is the MoltNode's capacity when the agent creates it (an
	// existing MoltNode's spec is the operator's).
	Capacity int32
	// Heartbeat is the interval of the MoltNode's status reports.
	Heartbeat time.Duration
	// Events records what the agent did as Kubernetes Events (nil:
	// none).
	Events events.EventRecorder

	poke chan struct{}
}

// CacheOptions restrict a node agent's cache of Sandboxes to those bound
// to node, as the kubelet watches only its node's pods.
func CacheOptions(node string) map[client.Object]cacheByObject {
	return map[client.Object]cacheByObject{&kv1.Sandbox{}: {Label: nodeSelector(node)}}
}

// SetupWithManager registers the agent's reconcilers and its heartbeat.
func (a *Agent) SetupWithManager(mgr ctrl.Manager) error {
	if a.Node == "" {
		return errors.New("node agent: no node name")
	}
	if a.Heartbeat <= 0 {
		a.Heartbeat = DefaultHeartbeat
	}
	a.poke = make(chan struct{}, 1)
	mine := func(o client.Object) bool { return o.GetLabels()[kv1.NodeLabel] == a.Node }
	if err := ctrl.NewControllerManagedBy(mgr).Named("molt-agent-sandbox-"+a.Node).
		For(&kv1.Sandbox{}, builderPredicate(mine)).
		Complete(reconcile.Func(a.reconcileSandbox)); err != nil {
		return err
	}
	// A checkpoint or a rollback asked of a sandbox that runs nowhere yet
	// (or elsewhere) is looked at again when the sandbox comes here.
	if err := ctrl.NewControllerManagedBy(mgr).Named("molt-agent-checkpoint-"+a.Node).
		For(&kv1.SandboxCheckpoint{}).
		Watches(&kv1.Sandbox{}, handler.EnqueueRequestsFromMapFunc(a.pendingOf(&kv1.SandboxCheckpointList{}))).
		Complete(reconcile.Func(a.reconcileCheckpoint)); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("molt-agent-rollback-"+a.Node).
		For(&kv1.SandboxRollback{}).
		Watches(&kv1.Sandbox{}, handler.EnqueueRequestsFromMapFunc(a.pendingOf(&kv1.SandboxRollbackList{}))).
		Watches(&kv1.SandboxCheckpoint{}, handler.EnqueueRequestsFromMapFunc(a.rollbacksTo)).
		Complete(reconcile.Func(a.reconcileRollback)); err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(a.heartbeat))
}

// pendingOf maps a Sandbox to the unfinished checkpoints or rollbacks
// (list's kind) of it.
func (a *Agent) pendingOf(list client.ObjectList) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := a.Client.List(ctx, l, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		switch l := l.(type) {
		case *kv1.SandboxCheckpointList:
			for _, ck := range l.Items {
				if ck.Spec.SandboxName == o.GetName() && ck.Status.Phase != kv1.OperationSucceeded && ck.Status.Phase != kv1.OperationFailed {
					reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ck.Namespace, Name: ck.Name}})
				}
			}
		case *kv1.SandboxRollbackList:
			for _, rb := range l.Items {
				if rb.Spec.SandboxName == o.GetName() && rb.Status.Phase != kv1.OperationSucceeded && rb.Status.Phase != kv1.OperationFailed {
					reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: rb.Namespace, Name: rb.Name}})
				}
			}
		}
		return reqs
	}
}

// rollbacksTo maps a SandboxCheckpoint to the unfinished rollbacks to it.
func (a *Agent) rollbacksTo(ctx context.Context, o client.Object) []reconcile.Request {
	var l kv1.SandboxRollbackList
	if err := a.Client.List(ctx, &l, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, rb := range l.Items {
		if rb.Spec.CheckpointName == o.GetName() && rb.Status.Phase != kv1.OperationSucceeded && rb.Status.Phase != kv1.OperationFailed {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: rb.Namespace, Name: rb.Name}})
		}
	}
	return reqs
}

// mine gets the Sandbox name of namespace ns if it is bound to this node.
func (a *Agent) mine(ctx context.Context, ns, name string) (*kv1.Sandbox, bool, error) {
	var sb kv1.Sandbox
	if err := a.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &sb); err != nil {
		return nil, false, client.IgnoreNotFound(err)
	}
	return &sb, sb.Labels[kv1.NodeLabel] == a.Node, nil
}

// moltName is the molt sandbox's name of a Sandbox: its UID, unique on
// every node, so that an agent that made the sandbox and died before
// recording its ID finds it again instead of making a second.
func moltName(sb *kv1.Sandbox) string { return "k8s-" + string(sb.UID) }

// checkpointLabel is the molt label of a SandboxCheckpoint's checkpoint:
// a retry after a lost status write finds it by this.
func checkpointLabel(ck *kv1.SandboxCheckpoint) string { return "k8s-" + string(ck.UID) }

// permanent says err is molt refusing the request as made (retrying it
// would not help), not a failure to reach it.
func permanent(err error) bool {
	for _, e := range []error{v1.ErrInvalidArgument, v1.ErrFailedPrecondition, v1.ErrConflict, v1.ErrNotSupported, v1.ErrPermissionDenied} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (a *Agent) reconcileSandbox(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	sb, ok, err := a.mine(ctx, req.Namespace, req.Name)
	if err != nil || !ok {
		return reconcile.Result{}, err
	}
	lg := log.FromContext(ctx).WithValues("node", a.Node)
	id := sb.Status.SandboxID
	if sb.DeletionTimestamp != nil {
		if !controllerutil.ContainsFinalizer(sb, kv1.SandboxFinalizer) {
			return reconcile.Result{}, nil
		}
		if err := a.remove(ctx, id); err != nil {
			return reconcile.Result{}, err
		}
		controllerutil.RemoveFinalizer(sb, kv1.SandboxFinalizer)
		lg.Info("removed", "sandbox", id)
		return reconcile.Result{}, client.IgnoreNotFound(a.Client.Update(ctx, sb))
	}
	if t := sb.Spec.Lifecycle.ShutdownTime; t != nil && !time.Now().Before(t.Time) {
		if sb.Status.Phase == kv1.SandboxExpired {
			return reconcile.Result{}, nil
		}
		if err := a.remove(ctx, id); err != nil {
			return reconcile.Result{}, err
		}
		lg.Info("expired", "sandbox", id)
		return reconcile.Result{}, a.setStatus(ctx, sb, func(st *kv1.SandboxStatus) {
			st.Phase, st.SandboxID, st.Head, st.Offloaded, st.Message = kv1.SandboxExpired, "", "", false, "expired at "+t.UTC().Format(time.RFC3339)
			setReady(st, sb.Generation, metav1.ConditionFalse, "Expired", "removed at its shutdown time")
		})
	}
	if !controllerutil.ContainsFinalizer(sb, kv1.SandboxFinalizer) {
		controllerutil.AddFinalizer(sb, kv1.SandboxFinalizer)
		return reconcile.Result{}, a.Client.Update(ctx, sb) // the update brings it back
	}
	var res reconcile.Result
	if sb.Spec.OperatingMode == kv1.Suspended {
		err = a.suspend(ctx, sb)
	} else {
		err = a.run(ctx, sb)
	}
	if apierrors.IsConflict(err) {
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil // read again
	}
	if err != nil {
		lg.Error(err, "sandbox", "sandbox", sb.Status.SandboxID)
		msg := err.Error()
		if serr := a.setStatus(ctx, sb, func(st *kv1.SandboxStatus) {
			st.Phase, st.Message = kv1.SandboxFailed, msg
			setReady(st, sb.Generation, metav1.ConditionFalse, "Failed", msg)
		}); serr != nil {
			return res, serr
		}
		// Retried with the controller's backoff.
		return res, err
	}
	if t := sb.Spec.Lifecycle.ShutdownTime; t != nil {
		res.RequeueAfter = time.Until(t.Time) + 10*time.Millisecond
	}
	return res, nil
}

// remove removes molt sandbox id, if this daemon has it.
func (a *Agent) remove(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	if err := a.Daemon.Remove(ctx, id); err != nil && !errors.Is(err, v1.ErrNotFound) {
		return fmt.Errorf("remove sandbox %s: %w", id, err)
	}
	return nil
}

// run makes the sandbox run here: created, forked, resumed from
// hibernation here, or resumed from the object store (adopted).
func (a *Agent) run(ctx context.Context, sb *kv1.Sandbox) error {
	id := sb.Status.SandboxID
	if id == "" {
		made, err := a.make(ctx, sb)
		if err != nil {
			return err
		}
		id = made
		// Recorded before anything else can fail, over any concurrent
		// write (the controller's condition): a fork is not found again
		// by name.
		if err := a.recordID(ctx, sb, id); err != nil {
			return fmt.Errorf("sandbox %s made, but not recorded (it stays on the node): %w", id, err)
		}
	}
	info, err := a.Daemon.Sandbox(ctx, id)
	switch {
	case errors.Is(err, v1.ErrNotFound):
		// In the object store, offloaded by another node: adopt it.
		info, err = a.Daemon.Resume(ctx, id)
	case err == nil && info.State == v1.StateHibernated:
		info, err = a.Daemon.Resume(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if info.State != v1.StateRunning {
		return fmt.Errorf("sandbox %s is %s, not running: %s", id, info.State, info.Reason)
	}
	return a.setStatus(ctx, sb, func(st *kv1.SandboxStatus) {
		st.Phase, st.NodeName, st.Head, st.Offloaded, st.Message = kv1.SandboxRunning, a.Node, info.Head, false, ""
		setReady(st, sb.Generation, metav1.ConditionTrue, "Running", "running on "+a.Node)
	})
}

// make creates or forks the molt sandbox of sb and returns its ID.
func (a *Agent) make(ctx context.Context, sb *kv1.Sandbox) (string, error) {
	if src := sb.Spec.Source; src != nil {
		var ck kv1.SandboxCheckpoint
		if err := a.Client.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: src.CheckpointName}, &ck); err != nil {
			return "", fmt.Errorf("checkpoint %s: %w", src.CheckpointName, err)
		}
		if ck.Status.Phase != kv1.OperationSucceeded {
			return "", fmt.Errorf("checkpoint %s is %s", src.CheckpointName, ck.Status.Phase)
		}
		res, err := a.Daemon.ForkCheckpoint(ctx, ck.Status.CheckpointID, 1)
		if err != nil {
			return "", fmt.Errorf("fork %s: %w", ck.Status.CheckpointID, err)
		}
		if len(res.Sandboxes) != 1 {
			return "", fmt.Errorf("fork %s made %d sandboxes", ck.Status.CheckpointID, len(res.Sandboxes))
		}
		return res.Sandboxes[0].ID, nil
	}
	name := moltName(sb)
	if info, err := a.Daemon.Sandbox(ctx, name); err == nil {
		return info.ID, nil
	} else if !errors.Is(err, v1.ErrNotFound) {
		return "", err
	}
	r := sb.Spec.Resources
	info, err := a.Daemon.Create(ctx, v1.SandboxCreateRequest{
		Image: sb.Spec.Image,
		Name:  name,
		Resources: v1.Resources{
			MemoryBytes: r.MemoryMiB << 20,
			CPUMillis:   r.MilliCPU,
			Pids:        r.Pids,
		},
	})
	if err != nil {
		return "", fmt.Errorf("create: %w", err)
	}
	return info.ID, nil
}

// suspend hibernates the sandbox into the object store.
func (a *Agent) suspend(ctx context.Context, sb *kv1.Sandbox) error {
	id := sb.Status.SandboxID
	if id == "" {
		return a.setStatus(ctx, sb, func(st *kv1.SandboxStatus) {
			st.Phase, st.Message = kv1.SandboxPending, "suspended before it ran"
		})
	}
	info, err := a.Daemon.Sandbox(ctx, id)
	switch {
	case errors.Is(err, v1.ErrNotFound) && sb.Status.Offloaded:
		info = v1.Sandbox{ID: id, State: v1.StateHibernated, Offloaded: true, Head: sb.Status.Head}
		err = nil
	case err != nil:
	case info.State == v1.StateRunning:
		info, err = a.Daemon.HibernateOffload(ctx, id)
	case info.State == v1.StateHibernated && !info.Offloaded:
		info, err = a.Daemon.Offload(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("suspend %s: %w", id, err)
	}
	if info.State != v1.StateHibernated || !info.Offloaded {
		return fmt.Errorf("suspend %s: it is %s (offloaded: %v)", id, info.State, info.Offloaded)
	}
	return a.setStatus(ctx, sb, func(st *kv1.SandboxStatus) {
		st.Phase, st.NodeName, st.Head, st.Offloaded, st.Message = kv1.SandboxSuspended, a.Node, info.Head, true, ""
		setReady(st, sb.Generation, metav1.ConditionFalse, ReasonSuspended, "hibernated to the object store")
	})
}

// recordID writes molt's ID of sb's sandbox into its status, reading sb
// again after each conflict.
func (a *Agent) recordID(ctx context.Context, sb *kv1.Sandbox, id string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := a.setStatus(ctx, sb, func(st *kv1.SandboxStatus) { st.SandboxID, st.NodeName = id, a.Node })
		if apierrors.IsConflict(err) {
			if gerr := a.Client.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}, sb); gerr != nil {
				return gerr
			}
			if sb.Status.SandboxID != "" && sb.Status.SandboxID != id {
				return fmt.Errorf("the Sandbox records sandbox %s already", sb.Status.SandboxID)
			}
		}
		return err // a conflict is tried again, over what was just read
	})
}

func setReady(st *kv1.SandboxStatus, gen int64, status metav1.ConditionStatus, reason, msg string) {
	st.ObservedGeneration = gen
	apimeta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: CondReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// setStatus changes sb's status with fn and writes it, only over the
// version read (a conflict is retried by the next reconcile).
func (a *Agent) setStatus(ctx context.Context, sb *kv1.Sandbox, fn func(*kv1.SandboxStatus)) error {
	old := sb.DeepCopy()
	fn(&sb.Status)
	if apiEqual(old.Status, sb.Status) {
		return nil
	}
	if err := a.Client.Status().Patch(ctx, sb, client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	if st := sb.Status; st.Phase != old.Status.Phase {
		note := "on node " + a.Node
		if st.SandboxID != "" {
			note = "molt sandbox " + st.SandboxID + " " + note
		}
		if st.Message != "" {
			note += ": " + st.Message
		}
		emit(a.Events, sb, st.Phase == kv1.SandboxFailed, string(st.Phase), "Reconcile", note)
	}
	return nil
}

func (a *Agent) reconcileCheckpoint(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ck kv1.SandboxCheckpoint
	if err := a.Client.Get(ctx, req.NamespacedName, &ck); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ck.DeletionTimestamp != nil {
		return a.deleteCheckpoint(ctx, &ck)
	}
	if ck.Status.Phase == kv1.OperationSucceeded || ck.Status.Phase == kv1.OperationFailed {
		return reconcile.Result{}, nil
	}
	sb, ok, err := a.mine(ctx, ck.Namespace, ck.Spec.SandboxName)
	if err != nil || !ok {
		return reconcile.Result{}, err
	}
	// Before the checkpoint is taken: a deletion from then on deletes it.
	if !controllerutil.ContainsFinalizer(&ck, kv1.CheckpointFinalizer) {
		controllerutil.AddFinalizer(&ck, kv1.CheckpointFinalizer)
		return reconcile.Result{}, a.Client.Update(ctx, &ck) // the update brings it back
	}
	if sb.Status.Phase != kv1.SandboxRunning || sb.Status.SandboxID == "" {
		return reconcile.Result{RequeueAfter: time.Second}, nil // not yet
	}
	id := sb.Status.SandboxID
	label := checkpointLabel(&ck)
	// A checkpoint taken before a lost status write is found by label.
	var taken *v1.Checkpoint
	if l, err := a.Daemon.Checkpoints(ctx, id); err == nil {
		for i := range l {
			if l[i].Label == label && !l[i].Failed {
				taken = &l[i]
			}
		}
	}
	if taken == nil {
		kind := "full"
		if ck.Spec.Kind == kv1.CheckpointFiles {
			kind = "fs"
		}
		c, err := a.Daemon.Checkpoint(ctx, id, v1.CheckpointRequest{Kind: kind, Label: label, Wait: true})
		if err != nil {
			if permanent(err) {
				return reconcile.Result{}, a.setCheckpoint(ctx, &ck, func(st *kv1.SandboxCheckpointStatus) {
					st.Phase, st.NodeName, st.Message = kv1.OperationFailed, a.Node, err.Error()
				})
			}
			return reconcile.Result{}, fmt.Errorf("checkpoint %s: %w", id, err)
		}
		taken = &c
	}
	now := metav1.Now()
	if err := a.setCheckpoint(ctx, &ck, func(st *kv1.SandboxCheckpointStatus) {
		st.Phase, st.CheckpointID, st.SandboxID, st.NodeName, st.TakenAt, st.Message = kv1.OperationSucceeded, taken.ID, id, a.Node, &now, ""
	}); err != nil {
		return reconcile.Result{}, err
	}
	a.pokeHeartbeat() // the node holds one more checkpoint
	return reconcile.Result{}, nil
}

// deleteCheckpoint handles a SandboxCheckpoint being deleted: the node
// agent of its sandbox deletes the molt checkpoint (and any taken for it
// whose status write was lost: by label), then lets the resource go. A
// sandbox that is gone took its checkpoints with it, and one that runs
// nowhere (suspended into the store) keeps the checkpoint under its
// document there: then the agent of the node that took it lets the
// resource go.
func (a *Agent) deleteCheckpoint(ctx context.Context, ck *kv1.SandboxCheckpoint) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(ck, kv1.CheckpointFinalizer) {
		return reconcile.Result{}, nil
	}
	sb, ok, err := a.mine(ctx, ck.Namespace, ck.Spec.SandboxName)
	if err != nil {
		return reconcile.Result{}, err
	}
	switch {
	case ok && sb.Status.SandboxID == "":
		// Not made yet: nothing was taken.
	case ok:
		ids := []string{}
		if ck.Status.CheckpointID != "" {
			ids = append(ids, ck.Status.CheckpointID)
		}
		if l, err := a.Daemon.Checkpoints(ctx, sb.Status.SandboxID); err == nil {
			for _, c := range l {
				if c.Label == checkpointLabel(ck) && c.ID != ck.Status.CheckpointID {
					ids = append(ids, c.ID)
				}
			}
		}
		for _, id := range ids {
			err := a.Daemon.DeleteCheckpoint(ctx, id)
			if errors.Is(err, v1.ErrFailedPrecondition) {
				// The head of a hibernated sandbox: kept until it moves.
				return reconcile.Result{RequeueAfter: 30 * time.Second}, a.setCheckpoint(ctx, ck, func(st *kv1.SandboxCheckpointStatus) {
					st.Message = "not deleted yet: " + err.Error()
				})
			}
			if err != nil && !errors.Is(err, v1.ErrNotFound) {
				return reconcile.Result{}, fmt.Errorf("delete checkpoint %s: %w", id, err)
			}
		}
	case sb != nil && sb.Labels[kv1.NodeLabel] != "":
		return reconcile.Result{}, nil // its node's agent deletes it
	case ck.Status.NodeName != "" && ck.Status.NodeName != a.Node:
		return reconcile.Result{}, nil // the agent of the node that took it lets it go
	}
	controllerutil.RemoveFinalizer(ck, kv1.CheckpointFinalizer)
	return reconcile.Result{}, client.IgnoreNotFound(a.Client.Update(ctx, ck))
}

func (a *Agent) setCheckpoint(ctx context.Context, ck *kv1.SandboxCheckpoint, fn func(*kv1.SandboxCheckpointStatus)) error {
	old := ck.DeepCopy()
	fn(&ck.Status)
	if err := a.Client.Status().Patch(ctx, ck, client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	switch st := ck.Status; {
	case st.Phase == old.Status.Phase:
	case st.Phase == kv1.OperationSucceeded:
		emit(a.Events, ck, false, "Taken", "Checkpoint", "checkpoint "+st.CheckpointID+" of molt sandbox "+st.SandboxID+" on node "+a.Node)
	case st.Phase == kv1.OperationFailed:
		emit(a.Events, ck, true, "Failed", "Checkpoint", st.Message)
	}
	return nil
}

func (a *Agent) reconcileRollback(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var rb kv1.SandboxRollback
	if err := a.Client.Get(ctx, req.NamespacedName, &rb); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if rb.Status.Phase == kv1.OperationSucceeded || rb.Status.Phase == kv1.OperationFailed {
		return reconcile.Result{}, nil
	}
	sb, ok, err := a.mine(ctx, rb.Namespace, rb.Spec.SandboxName)
	if err != nil || !ok {
		return reconcile.Result{}, err
	}
	fail := func(msg string) error {
		return a.setRollback(ctx, &rb, func(st *kv1.SandboxRollbackStatus) {
			st.Phase, st.NodeName, st.Message = kv1.OperationFailed, a.Node, msg
		})
	}
	var ck kv1.SandboxCheckpoint
	if err := a.Client.Get(ctx, types.NamespacedName{Namespace: rb.Namespace, Name: rb.Spec.CheckpointName}, &ck); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return reconcile.Result{}, fail("no SandboxCheckpoint " + rb.Spec.CheckpointName)
		}
		return reconcile.Result{}, err
	}
	switch {
	case ck.Spec.SandboxName != sb.Name:
		return reconcile.Result{}, fail(fmt.Sprintf("checkpoint %s is of sandbox %s", ck.Name, ck.Spec.SandboxName))
	case ck.Status.Phase == kv1.OperationFailed:
		return reconcile.Result{}, fail("checkpoint " + ck.Name + " failed")
	case ck.Status.Phase != kv1.OperationSucceeded, sb.Status.Phase != kv1.SandboxRunning:
		return reconcile.Result{RequeueAfter: time.Second}, nil // not yet
	}
	res, err := a.Daemon.RollbackWith(ctx, sb.Status.SandboxID, v1.RollbackRequest{Checkpoint: ck.Status.CheckpointID})
	if err != nil {
		if permanent(err) {
			return reconcile.Result{}, fail(err.Error())
		}
		return reconcile.Result{}, fmt.Errorf("rollback %s to %s: %w", sb.Status.SandboxID, ck.Status.CheckpointID, err)
	}
	now := metav1.Now()
	return reconcile.Result{}, a.setRollback(ctx, &rb, func(st *kv1.SandboxRollbackStatus) {
		st.Phase, st.NodeName, st.Tier, st.CompletedAt, st.Message = kv1.OperationSucceeded, a.Node, res.Tier, &now, ""
	})
}

func (a *Agent) setRollback(ctx context.Context, rb *kv1.SandboxRollback, fn func(*kv1.SandboxRollbackStatus)) error {
	old := rb.DeepCopy()
	fn(&rb.Status)
	if err := a.Client.Status().Patch(ctx, rb, client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	switch st := rb.Status; {
	case st.Phase == old.Status.Phase:
	case st.Phase == kv1.OperationSucceeded:
		emit(a.Events, rb, false, "RolledBack", "Rollback", "to "+rb.Spec.CheckpointName+" ("+st.Tier+") on node "+a.Node)
	case st.Phase == kv1.OperationFailed:
		emit(a.Events, rb, true, "Failed", "Rollback", st.Message)
	}
	return nil
}

func (a *Agent) pokeHeartbeat() {
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// heartbeat keeps the MoltNode: made if missing, its status reported
// every interval and whenever the node took a checkpoint.
func (a *Agent) heartbeat(ctx context.Context) error {
	t := time.NewTicker(a.Heartbeat)
	defer t.Stop()
	for {
		if err := a.report(ctx); err != nil && ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "heartbeat", "node", a.Node)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-a.poke:
		}
	}
}

// report writes the MoltNode's status: what the daemon runs and which
// of the cluster's checkpoints it holds locally.
func (a *Agent) report(ctx context.Context) error {
	var n kv1.MoltNode
	err := a.Client.Get(ctx, types.NamespacedName{Name: a.Node}, &n)
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	if err != nil {
		n = kv1.MoltNode{ObjectMeta: metav1.ObjectMeta{Name: a.Node}, Spec: kv1.MoltNodeSpec{Capacity: a.Capacity}}
		if err := a.Client.Create(ctx, &n); err != nil {
			return err
		}
	}
	old := n.DeepCopy()
	st := &n.Status
	st.Message = ""
	sbs, err := a.Daemon.Sandboxes(ctx)
	if err != nil {
		st.Message = "daemon: " + err.Error()
		return a.Client.Status().Patch(ctx, &n, client.MergeFrom(old))
	}
	h, err := a.Daemon.Host(ctx)
	if err != nil {
		st.Message = "daemon: " + err.Error()
		return a.Client.Status().Patch(ctx, &n, client.MergeFrom(old))
	}
	st.HostKey = h.PublicKey
	var nodes kv1.MoltNodeList
	if err := a.Client.List(ctx, &nodes); err != nil {
		return err
	}
	if err := a.trustPeers(ctx, h, nodes.Items); err != nil {
		st.Message = err.Error()
	}
	st.Sandboxes = 0
	for _, s := range sbs {
		if s.State == v1.StateRunning {
			st.Sandboxes++
		}
	}
	var cks kv1.SandboxCheckpointList
	if err := a.Client.List(ctx, &cks); err != nil {
		return err
	}
	st.Checkpoints = st.Checkpoints[:0]
	for _, ck := range cks.Items {
		id := ck.Status.CheckpointID
		if id == "" || len(st.Checkpoints) == maxNodeCheckpoints || slices.Contains(st.Checkpoints, id) {
			continue
		}
		if info, err := a.Daemon.CheckpointInfo(ctx, id); err == nil && !info.Offloaded && !info.Failed {
			st.Checkpoints = append(st.Checkpoints, id)
		}
	}
	slices.Sort(st.Checkpoints)
	now := metav1.Now()
	st.HeartbeatTime = &now
	return a.Client.Status().Patch(ctx, &n, client.MergeFrom(old))
}
