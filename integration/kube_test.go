package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	kv1 "github.com/molt-sh/molt/api/kube/v1alpha1"
	moltclient "github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/kube"
	"github.com/molt-sh/molt/internal/objstore/s3test"
)

// kubeAssets is the directory of kube-apiserver and etcd, built by
// scripts/kube-assets.sh (make deps): KUBEBUILDER_ASSETS, else the
// script's cache. Without them the test skips, unless
// MOLT_REQUIRE_PRIVILEGED=1, where it fails.
func kubeAssets(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		cache := os.Getenv("MOLT_KUBE_CACHE")
		if cache == "" {
			cache = "/var/cache/molt/kube"
		}
		dir = filepath.Join(cache, "v1.37.2", "bin")
	}
	for _, f := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			msg := fmt.Sprintf("no %s in %s: scripts/kube-assets.sh (make deps) builds it", f, dir)
			if os.Getenv("MOLT_REQUIRE_PRIVILEGED") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	return dir
}

// lockedLog collects the managers' logs, shown when the test fails.
type lockedLog struct {
	mu  sync.Mutex
	buf []byte
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	return len(p), nil
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(tail(l.buf, 20000))
}

// TestKubernetes runs molt's controller and two node agents against a
// real kube-apiserver and etcd (envtest), the agents backed by two molt
// daemons with their own roots on one S3 bucket, as two nodes: a
// Sandbox is placed by capacity, checkpointed (SandboxCheckpoint),
// forked on the node that holds the checkpoint, suspended into the
// store and unbound, resumed on the other node (the first is cordoned)
// with its session and counter, rolled back there to the checkpoint
// taken on the first (SandboxRollback), and deleted (its finalizer
// removes the molt sandbox).
func TestKubernetes(t *testing.T) {
	requireCRIU(t)
	assets := kubeAssets(t)

	srv := s3test.Start(t)
	creds := []string{"AWS_ACCESS_KEY_ID=" + srv.AccessKey, "AWS_SECRET_ACCESS_KEY=" + srv.SecretKey}
	store := []string{"--store", "s3://" + srv.Bucket + "/it-kube", "--store-endpoint", srv.Endpoint}
	// The daemons do not trust each other's keys: the node agents have
	// them trust each other through their MoltNodes.
	dirA, dirB := t.TempDir(), t.TempDir()
	hostA := startHost(t, "ka", dirA, creds, store...)
	hostB := startHost(t, "kb", dirB, creds, store...)
	hosts := map[string]host{"node-a": hostA, "node-b": hostB}

	logs := &lockedLog{}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))
	tenv := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "deploy", "kubernetes", "crd")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
	}
	cfg, err := tenv.Start()
	if err != nil {
		t.Fatalf("envtest (kube-apiserver and etcd from %s): %v", assets, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := tenv.Stop(); err != nil {
			t.Errorf("envtest stop: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller and agents' log ends with:\n%s", logs)
		}
	})
	const heartbeat = time.Second
	start := func(name string, mgr ctrl.Manager, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := mgr.Start(ctx); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	c, err := client.New(cfg, client.Options{Scheme: kube.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	const ns = "default"
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	wait := func(what string, timeout time.Duration, fn func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			ok, state := fn()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after %s; last: %s", what, timeout, state)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// The deployment's own RBAC, applied; its workloads, validated by
	// the apiserver (dry run: nothing runs them here).
	deploy := filepath.Join("..", "deploy", "kubernetes")
	applyManifests(t, c, filepath.Join(deploy, "rbac.yaml"), false)
	applyManifests(t, c, filepath.Join(deploy, "agent-policy.yaml"), false)
	applyManifests(t, c, filepath.Join(deploy, "controller.yaml"), true)
	applyManifests(t, c, filepath.Join(deploy, "node.yaml"), true)
	// The controller and the agents run as their service accounts, an
	// agent's with its node's name as a token bound to its pod carries it.
	as := func(sa, node string) *rest.Config {
		cc := rest.CopyConfig(cfg)
		cc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:molt-system:" + sa}
		if node != "" {
			cc.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
		}
		return cc
	}
	// A node agent may not make sandboxes (RBAC), nor touch another
	// node's (the admission policy, once the apiserver has loaded it).
	ac, err := client.New(as("molt-node-agent", "node-a"), client.Options{Scheme: kube.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := ac.Create(ctx, &kv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "by-agent"}, Spec: kv1.SandboxSpec{Image: image}}); !apierrors.IsForbidden(err) {
		t.Fatalf("a node agent creating a Sandbox: %v, want forbidden", err)
	}
	other := &kv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "on-b", Labels: map[string]string{kv1.NodeLabel: "node-b"}},
		Spec: kv1.SandboxSpec{Image: image, OperatingMode: kv1.Suspended}}
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	wait("the admission policy refuses node-a's agent node-b's sandbox", time.Minute, func() (bool, string) {
		var sb kv1.Sandbox
		if err := ac.Get(ctx, key("on-b"), &sb); err != nil {
			return false, err.Error()
		}
		old := sb.DeepCopy()
		sb.Status.Message = "from node-a"
		err := ac.Status().Patch(ctx, &sb, client.MergeFrom(old))
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "bound to its node"), fmt.Sprint(err)
	})
	for _, mn := range []string{"node-b", "node-c"} {
		if err := ac.Create(ctx, &kv1.MoltNode{ObjectMeta: metav1.ObjectMeta{Name: mn}, Spec: kv1.MoltNodeSpec{Capacity: 1}}); !apierrors.IsForbidden(err) {
			t.Fatalf("node-a's agent making MoltNode %s: %v, want forbidden", mn, err)
		}
	}
	if err := c.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}
	opts := kube.ManagerOptions{MetricsAddr: "0"}
	mgr, err := kube.NewControllerManager(as("molt-controller", ""), &kube.Scheduler{Heartbeat: heartbeat}, opts)
	start("controller", mgr, err)
	for node, h := range hosts {
		a := &kube.Agent{Daemon: moltclient.New(h.socket), Node: node, Capacity: 4, Heartbeat: heartbeat}
		mgr, err := kube.NewAgentManager(as("molt-node-agent", node), a, opts)
		start("agent "+node, mgr, err)
	}
	for node, h := range hosts {
		peer := hosts["node-a"]
		if node == "node-a" {
			peer = hosts["node-b"]
		}
		wait(node+"'s daemon trusts the other node's key", time.Minute, func() (bool, string) {
			mine, err := moltclient.New(h.socket).Host(ctx)
			if err != nil {
				return false, err.Error()
			}
			theirs, err := moltclient.New(peer.socket).Host(ctx)
			if err != nil {
				return false, err.Error()
			}
			var mn kv1.MoltNode
			if err := c.Get(ctx, types.NamespacedName{Name: node}, &mn); err != nil || mn.Status.HostKey != mine.PublicKey {
				return false, fmt.Sprintf("MoltNode %s: host key %q (%v), want its daemon's", node, mn.Status.HostKey, err)
			}
			return slices.Contains(mine.TrustedKeys, theirs.KeyID), fmt.Sprintf("trusted %v, the other's %s", mine.TrustedKeys, theirs.KeyID)
		})
	}
	sandbox := func(name string) kv1.Sandbox {
		t.Helper()
		var sb kv1.Sandbox
		if err := c.Get(ctx, key(name), &sb); err != nil {
			t.Fatalf("get sandbox %s: %v", name, err)
		}
		return sb
	}
	waitPhase := func(name string, phase kv1.SandboxPhase) kv1.Sandbox {
		t.Helper()
		var sb kv1.Sandbox
		wait("sandbox "+name+" "+string(phase), 3*time.Minute, func() (bool, string) {
			sb = sandbox(name)
			return sb.Status.Phase == phase, fmt.Sprintf("%+v labels %v", sb.Status, sb.Labels)
		})
		return sb
	}
	create := func(obj client.Object) {
		t.Helper()
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %s: %v", obj.GetName(), err)
		}
	}
	exec := func(sb kv1.Sandbox, script string) string {
		t.Helper()
		return hosts[sb.Status.NodeName].must(t, "exec", sb.Status.SandboxID, "--session", "s", "--", script)
	}
	// The nodes are reported.
	wait("both MoltNodes heard from", time.Minute, func() (bool, string) {
		var l kv1.MoltNodeList
		if err := c.List(ctx, &l); err != nil {
			return false, err.Error()
		}
		n := 0
		for _, m := range l.Items {
			if m.Status.HeartbeatTime != nil {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%d nodes", n)
	})

	// The API refuses a Sandbox with both an image and a source.
	bad := &kv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad"},
		Spec: kv1.SandboxSpec{Image: image, Source: &kv1.SandboxSource{CheckpointName: "x"}}}
	if err := c.Create(ctx, bad); err == nil || !apierrors.IsInvalid(err) {
		t.Fatalf("a Sandbox with an image and a source: %v", err)
	}

	// Placed by room: the first on node-a (a tie, by name), the second
	// on node-b, the third on node-a again.
	for i, want := range []string{"node-a", "node-b", "node-a"} {
		name := fmt.Sprintf("s%d", i+1)
		create(&kv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kv1.SandboxSpec{Image: image}})
		sb := waitPhase(name, kv1.SandboxRunning)
		if sb.Status.NodeName != want || sb.Labels[kv1.NodeLabel] != want {
			t.Fatalf("sandbox %s on %s (label %q), want %s", name, sb.Status.NodeName, sb.Labels[kv1.NodeLabel], want)
		}
		if out := hosts[want].must(t, "ls"); !strings.Contains(out, sb.Status.SandboxID) {
			t.Fatalf("%s's daemon does not list %s:\n%s", want, sb.Status.SandboxID, out)
		}
	}
	s1 := sandbox("s1")
	exec(s1, "export X=42; echo stored > /root/f")
	hostA.must(t, "exec", s1.Status.SandboxID, "-d", "--", "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done")

	// A checkpoint, taken by node-a's agent; node-a then reports it held.
	create(&kv1.SandboxCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1"}, Spec: kv1.SandboxCheckpointSpec{SandboxName: "s1"}})
	var ck kv1.SandboxCheckpoint
	wait("checkpoint c1", 2*time.Minute, func() (bool, string) {
		if err := c.Get(ctx, key("c1"), &ck); err != nil {
			return false, err.Error()
		}
		return ck.Status.Phase == kv1.OperationSucceeded, fmt.Sprintf("%+v", ck.Status)
	})
	if ck.Status.NodeName != "node-a" || ck.Status.SandboxID != s1.Status.SandboxID || ck.Status.CheckpointID == "" {
		t.Fatalf("checkpoint c1: %+v", ck.Status)
	}
	// What happened is in Events too: the binding (the controller's),
	// the sandbox running and the checkpoint taken (node-a's agent's).
	wait("events of s1 and c1", 30*time.Second, func() (bool, string) {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		want := map[string]bool{"s1/Scheduled/molt.sh/controller": false, "s1/Running/molt.sh/node-agent": false, "c1/Taken/molt.sh/node-agent": false}
		var seen []string
		for _, e := range evs.Items {
			k := e.Regarding.Name + "/" + e.Reason + "/" + e.ReportingController
			seen = append(seen, k+": "+e.Note)
			if _, ok := want[k]; ok && (e.Reason != "Taken" || strings.Contains(e.Note, ck.Status.CheckpointID)) {
				want[k] = true
			}
		}
		for _, ok := range want {
			if !ok {
				return false, strings.Join(seen, "; ")
			}
		}
		return true, ""
	})
	wait("node-a reports c1 held", 30*time.Second, func() (bool, string) {
		var n kv1.MoltNode
		if err := c.Get(ctx, types.NamespacedName{Name: "node-a"}, &n); err != nil {
			return false, err.Error()
		}
		return slices.Contains(n.Status.Checkpoints, ck.Status.CheckpointID), fmt.Sprintf("%v", n.Status.Checkpoints)
	})
	exec(s1, "echo changed > /root/f")

	// A fork of it goes where the checkpoint is held, though node-b has
	// more room (node-a runs two sandboxes, node-b one).
	create(&kv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "f1"}, Spec: kv1.SandboxSpec{Source: &kv1.SandboxSource{CheckpointName: "c1"}}})
	f1 := waitPhase("f1", kv1.SandboxRunning)
	if f1.Status.NodeName != "node-a" {
		t.Fatalf("fork f1 on %s, want node-a (which holds c1)", f1.Status.NodeName)
	}
	if out := exec(f1, "echo $X; cat /root/f"); out != "42\nstored\n" {
		t.Fatalf("fork f1 of c1: %q", out)
	}

	// Suspended: hibernated into the store, then unbound.
	patchSpec := func(name string, fn func(*kv1.Sandbox)) {
		t.Helper()
		sb := sandbox(name)
		old := sb.DeepCopy()
		fn(&sb)
		if err := c.Patch(ctx, &sb, client.MergeFrom(old)); err != nil {
			t.Fatalf("patch %s: %v", name, err)
		}
	}
	patchSpec("s1", func(sb *kv1.Sandbox) { sb.Spec.OperatingMode = kv1.Suspended })
	wait("s1 suspended and unbound", 3*time.Minute, func() (bool, string) {
		sb := sandbox("s1")
		return sb.Status.Phase == kv1.SandboxSuspended && sb.Status.Offloaded && sb.Labels[kv1.NodeLabel] == "",
			fmt.Sprintf("%+v labels %v", sb.Status, sb.Labels)
	})

	// node-a cordoned, s1 resumes on node-b from the store, its session
	// and its counter as they were.
	cordon := func(name string, on bool) {
		t.Helper()
		var n kv1.MoltNode
		if err := c.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		old := n.DeepCopy()
		n.Spec.Unschedulable = on
		if err := c.Patch(ctx, &n, client.MergeFrom(old)); err != nil {
			t.Fatal(err)
		}
	}
	cordon("node-a", true)
	patchSpec("s1", func(sb *kv1.Sandbox) { sb.Spec.OperatingMode = kv1.Running })
	s1 = waitPhase("s1", kv1.SandboxRunning)
	if s1.Status.NodeName != "node-b" {
		t.Fatalf("s1 resumed on %s, want node-b (node-a is unschedulable)", s1.Status.NodeName)
	}
	if out := exec(s1, "echo $X; cat /root/f; a=$(cat /tmp/n); sleep 0.3; b=$(cat /tmp/n); [ $b -gt $a ] && echo counting"); out != "42\nchanged\ncounting\n" {
		t.Fatalf("s1 on node-b: %q", out)
	}

	// Rolled back on node-b to the checkpoint node-a took.
	create(&kv1.SandboxRollback{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r1"}, Spec: kv1.SandboxRollbackSpec{SandboxName: "s1", CheckpointName: "c1"}})
	var rb kv1.SandboxRollback
	wait("rollback r1", 3*time.Minute, func() (bool, string) {
		if err := c.Get(ctx, key("r1"), &rb); err != nil {
			return false, err.Error()
		}
		return rb.Status.Phase == kv1.OperationSucceeded || rb.Status.Phase == kv1.OperationFailed, fmt.Sprintf("%+v", rb.Status)
	})
	if rb.Status.Phase != kv1.OperationSucceeded || rb.Status.NodeName != "node-b" {
		t.Fatalf("rollback r1: %+v", rb.Status)
	}
	if out := exec(s1, "echo $X; cat /root/f"); out != "42\nstored\n" {
		t.Fatalf("s1 after the rollback to c1: %q", out)
	}
	// A rollback to another sandbox's checkpoint is refused, not retried.
	create(&kv1.SandboxRollback{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r2"}, Spec: kv1.SandboxRollbackSpec{SandboxName: "s2", CheckpointName: "c1"}})
	wait("rollback r2 refused", time.Minute, func() (bool, string) {
		if err := c.Get(ctx, key("r2"), &rb); err != nil {
			return false, err.Error()
		}
		return rb.Status.Phase == kv1.OperationFailed && strings.Contains(rb.Status.Message, "of sandbox s1"), fmt.Sprintf("%+v", rb.Status)
	})

	// Suspended again, and resumed back on node-a (node-b cordoned now),
	// which still has its own older record of the sandbox: what runs is
	// the state node-b suspended.
	exec(s1, "echo on b > /root/g")
	patchSpec("s1", func(sb *kv1.Sandbox) { sb.Spec.OperatingMode = kv1.Suspended })
	wait("s1 suspended and unbound again", 3*time.Minute, func() (bool, string) {
		sb := sandbox("s1")
		return sb.Status.Phase == kv1.SandboxSuspended && sb.Labels[kv1.NodeLabel] == "", fmt.Sprintf("%+v labels %v", sb.Status, sb.Labels)
	})
	// A checkpoint asked while it runs nowhere is taken once it runs.
	create(&kv1.SandboxCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c2"}, Spec: kv1.SandboxCheckpointSpec{SandboxName: "s1", Kind: kv1.CheckpointFiles}})
	cordon("node-b", true)
	cordon("node-a", false)
	patchSpec("s1", func(sb *kv1.Sandbox) { sb.Spec.OperatingMode = kv1.Running })
	s1 = waitPhase("s1", kv1.SandboxRunning)
	if s1.Status.NodeName != "node-a" {
		t.Fatalf("s1 resumed on %s, want node-a", s1.Status.NodeName)
	}
	if out := exec(s1, "echo $X; cat /root/f /root/g"); out != "42\nstored\non b\n" {
		t.Fatalf("s1 back on node-a: %q", out)
	}
	wait("checkpoint c2, asked while s1 was suspended", 2*time.Minute, func() (bool, string) {
		if err := c.Get(ctx, key("c2"), &ck); err != nil {
			return false, err.Error()
		}
		return ck.Status.Phase == kv1.OperationSucceeded && ck.Status.NodeName == "node-a", fmt.Sprintf("%+v", ck.Status)
	})

	// A node agent changes nothing of a checkpoint but its finalizer.
	var c2 kv1.SandboxCheckpoint
	if err := ac.Get(ctx, key("c2"), &c2); err != nil {
		t.Fatal(err)
	}
	if !controllerutil.ContainsFinalizer(&c2, kv1.CheckpointFinalizer) {
		t.Fatalf("checkpoint c2 has finalizers %v, want %s", c2.Finalizers, kv1.CheckpointFinalizer)
	}
	c2.Labels = map[string]string{"by": "agent"}
	if err := ac.Update(ctx, &c2); !apierrors.IsForbidden(err) {
		t.Fatalf("node-a's agent labelling a checkpoint: %v, want forbidden", err)
	}
	// Deleted: node-a's agent deletes the molt checkpoint, then the
	// resource goes.
	c2id := ck.Status.CheckpointID
	if r := hostA.molt(t, "checkpoint", "inspect", c2id); r.code != 0 {
		t.Fatalf("node-a does not have checkpoint %s of c2: %s", c2id, r.stderr)
	}
	if err := c.Delete(ctx, &ck); err != nil {
		t.Fatal(err)
	}
	wait("c2 deleted", 2*time.Minute, func() (bool, string) {
		err := c.Get(ctx, key("c2"), &kv1.SandboxCheckpoint{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if r := hostA.molt(t, "checkpoint", "inspect", c2id); r.code == 0 {
		t.Fatalf("node-a still has checkpoint %s after its SandboxCheckpoint was deleted", c2id)
	}

	// Deleted: the agent removes the molt sandbox, then the resource goes.
	id := s1.Status.SandboxID
	if err := c.Delete(ctx, &s1); err != nil {
		t.Fatal(err)
	}
	wait("s1 deleted", 2*time.Minute, func() (bool, string) {
		err := c.Get(ctx, key("s1"), &kv1.Sandbox{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if out := hostA.must(t, "ls"); strings.Contains(out, id) {
		t.Fatalf("node-a still lists %s after its Sandbox was deleted:\n%s", id, out)
	}
}

// applyManifests creates every object of the YAML file path (a dry run
// if dryRun); an object that exists already is left.
func applyManifests(t *testing.T, c client.Client, path string, dryRun bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var opts []client.CreateOption
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	n := 0
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		n++
		if err := c.Create(context.Background(), &u, opts...); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: %s %s: %v", path, u.GetKind(), u.GetName(), err)
		}
	}
	if n == 0 {
		t.Fatalf("%s holds no object", path)
	}
}
