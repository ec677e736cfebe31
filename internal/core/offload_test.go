package core

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/egress"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/objstore/s3test"
	"github.com/molt-sh/molt/internal/remote"
)

// openManagerStore opens a manager of a root of its own with object
// store b, trusting the host keys in the files pubs.
func openManagerStore(t testing.TB, b objstore.Bucket, pubs ...string) *Manager {
	t.Helper()
	return openManagerStoreAt(t, t.TempDir(), b, pubs...)
}

// openManagerStoreAt is openManagerStore on root.
func openManagerStoreAt(t testing.TB, root string, b objstore.Bucket, pubs ...string) *Manager {
	t.Helper()
	// A cgroup parent of its own: two managers stand for two hosts, and
	// a sandbox keeps its ID from one to the other.
	return openManagerConfig(t, Config{Root: root, TrustedKeys: pubs, Store: b, CgroupParent: "molt-test-" + filepath.Base(root), PoolSize: testPoolSize})
}

// testPoolSize is the pools' size of the managers on a store (0: the
// default): benchmarks of large sandboxes raise it.
var testPoolSize int64

// trustingHosts opens a manager on store b standing for one host, and
// returns it with the opener of a second (another root and pool) that
// trusts it and that it trusts: the second's key is made first.
func trustingHosts(t testing.TB, b objstore.Bucket) (*Manager, func() *Manager) {
	t.Helper()
	root2 := t.TempDir()
	if _, err := ckstore.LoadKeyring(filepath.Join(root2, "keys"), nil); err != nil {
		t.Fatal(err)
	}
	m := openManagerStore(t, b, filepath.Join(root2, "keys", "host.pub"))
	return m, func() *Manager {
		return openManagerStoreAt(t, root2, b, filepath.Join(m.cfg.Root, "keys", "host.pub"))
	}
}

// startCounter runs counterWriter in sandbox id of m, in the background.
func startCounter(t *testing.T, m *Manager, id string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.sbRoot(id), "w.py"), []byte(counterWriter), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, m, id, "python3 /w.py >/dev/null 2>&1 &")
}

// counting waits until the counter writer of sandbox sb (root) has
// counted past n, and returns the count.
func counting(t *testing.T, root string, n int) int {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(root, "c"))
		if c := lastCount(b); c > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter is not counting past %d", n)
		}
	}
}

// TestOffloadResumeAnywhere hibernates a sandbox with a running counter
// to the store, frees its local copy, resumes it on its own daemon, then
// offloads it again and resumes it on a second daemon (another root,
// another pool) that shares the store: the counter goes on from where
// it was, and the first daemon may not resume it any more.
func TestOffloadResumeAnywhere(t *testing.T) {
	bucket := testBucket(t)
	m, second := trustingHosts(t, bucket)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	startCounter(t, m, sb.ID)
	counting(t, m.sbRoot(sb.ID), 20)
	if _, err := m.Offload(ctx, sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("offload of a running sandbox: %v", err)
	}
	if _, err := m.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	at := lastCount(readFile(t, filepath.Join(m.sbRoot(sb.ID), "c")))
	got, err := m.Offload(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	head := got.Head
	if !got.Offloaded || got.State != v1.StateHibernated {
		t.Fatalf("offloaded sandbox: %+v", got)
	}
	for _, p := range []string{m.ckDir(head), m.sbRoot(sb.ID)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s is still here after the offload: %v", p, err)
		}
	}
	ck, err := m.CheckpointInfo(head)
	if err != nil || !ck.InStore || !ck.Offloaded {
		t.Fatalf("checkpoint %s: %+v, %v", head, ck, err)
	}

	// Back on its own daemon.
	if _, err := m.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if c := counting(t, m.sbRoot(sb.ID), at); c <= at {
		t.Fatalf("resumed counter at %d", c)
	}
	if b := readFile(t, filepath.Join(m.sbRoot(sb.ID), "c")); lastCount(b[:len(b)/2]) > at {
		t.Fatal("the counter's file is not the checkpoint's")
	}

	// Offloaded again, and resumed on another daemon.
	if _, err := m.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	at = lastCount(readFile(t, filepath.Join(m.sbRoot(sb.ID), "c")))
	got, err = m.Offload(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Head == head {
		t.Fatalf("the second hibernation is at the first one's checkpoint %s", head)
	}
	untrusting := openManagerStore(t, bucket)
	if _, err := untrusting.Resume(ctx, sb.ID); err == nil {
		t.Fatal("a daemon that does not trust the first one's key resumed its sandbox")
	}
	if err := untrusting.Remove(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal(err)
	}
	m2 := second()
	got2, err := m2.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got2.State != v1.StateRunning || got2.Offloaded {
		t.Fatalf("resumed on the second daemon: %+v", got2)
	}
	if c := counting(t, m2.sbRoot(sb.ID), at); c <= at {
		t.Fatalf("counter at %d on the second daemon", c)
	}
	if _, err := m.Resume(ctx, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("the first daemon resumed a sandbox the second one runs: %v", err)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testBucket is a bucket of its own on the real S3 server of the tests
// (internal/objstore/s3test), started once per test.
func testBucket(t *testing.T) objstore.Bucket {
	t.Helper()
	return s3test.Start(t).OpenBucket(t, "")
}

// TestStoreCache bounds the local copies of stored checkpoints: the
// least recently used are freed once in the store, and a rollback to
// one (files only, and files and processes) fetches it back.
func TestStoreCache(t *testing.T) {
	m := openManagerConfig(t, Config{Root: t.TempDir(), Store: testBucket(t), StoreCache: 1})
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "echo one > /f; V=1")
	fsck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "echo two > /f; V=2")
	full, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "echo three > /f; V=3")
	if _, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS}); err != nil {
		t.Fatal(err)
	}
	// Uploaded in the background.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		a, _ := m.CheckpointInfo(fsck.ID)
		b, _ := m.CheckpointInfo(full.ID)
		if a.InStore && b.InStore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoints not uploaded: %+v %+v", a, b)
		}
	}
	defer func(g time.Duration) { evictGrace = g }(evictGrace)
	evictGrace = 0
	t.Logf("fs checkpoint %s, full checkpoint %s", fsck.ID, full.ID)
	m.evict()
	for _, id := range []string{fsck.ID, full.ID} {
		ck, _ := m.CheckpointInfo(id)
		if !ck.Offloaded {
			t.Fatalf("checkpoint %s not evicted: %+v", id, ck)
		}
		if _, err := os.Lstat(m.ckDir(id)); !errors.Is(err, os.ErrNotExist) {
			out, _ := exec.Command("find", m.ckDir(id)).CombinedOutput()
			t.Fatalf("checkpoint %s's local copy is still here: %v\n%s", id, err, out)
		}
	}
	evictGrace = time.Hour
	if _, err := m.Rollback(ctx, sb.ID, full.ID); err != nil {
		t.Fatal(err)
	}
	if out := run(t, m, sb.ID, "cat /f; echo $V"); out.Stdout != "two\n2\n" {
		t.Fatalf("after a rollback to the evicted full checkpoint: %q", out.Stdout)
	}
	if _, err := m.Rollback(ctx, sb.ID, fsck.ID); err != nil {
		t.Fatal(err)
	}
	if out := run(t, m, sb.ID, "cat /f"); out.Stdout != "one\n" {
		t.Fatalf("after a rollback to the evicted fs checkpoint: %q", out.Stdout)
	}
	if ck, _ := m.CheckpointInfo(full.ID); ck.Offloaded {
		t.Fatal("the fetched checkpoint is still listed as offloaded")
	}
}

// testCgroup is the cgroup of sandbox id of a manager with the default
// cgroup parent.
func testCgroup(id string) string { return "molt/" + id }

// TestStoredRecordKeepsNoKey: the store's copy of a sandbox's record
// holds no private key of its egress proxy's CA.
func TestStoredRecordKeepsNoKey(t *testing.T) {
	rec := sandboxRec{Sandbox: meta.Sandbox{ID: "sb0000000001", Network: v1.NetworkEgress,
		Egress: &meta.Egress{CAKey: "PRIVATE-KEY-MATERIAL", CACert: "cert"}}}
	b, err := storedRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "PRIVATE-KEY-MATERIAL") {
		t.Fatalf("the stored record holds the CA's key: %s", b)
	}
	var back sandboxRec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Network != v1.NetworkEgress || back.Egress == nil || back.Egress.CACert != "cert" {
		t.Fatalf("the stored record lost its egress (the target needs its policy and certificate): %s", b)
	}
	if rec.Egress.CAKey != "PRIVATE-KEY-MATERIAL" {
		t.Fatal("storedRecord changed the sandbox's own record")
	}
}

// TestHandedOver: a sandbox with TLS inspection adopted from the store
// takes its CA's key only from a migration's handover, and only the key
// of the certificate its signed record holds.
func TestHandedOver(t *testing.T) {
	mk := func() (cert, key string) {
		ca, err := egress.NewCA("molt sandbox test")
		if err != nil {
			t.Fatal(err)
		}
		k, err := ca.KeyPEM()
		if err != nil {
			t.Fatal(err)
		}
		return string(ca.CertPEM()), string(k)
	}
	cert, key := mk()
	_, otherKey := mk()
	e := meta.Egress{Addr: netip.MustParseAddr("10.201.0.2"), CACert: cert}
	if _, err := handedOver("sb", e, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("no handover: %v, want failed_precondition", err)
	}
	if _, err := handedOver("sb", e, &v1.Handover{EgressCAKey: otherKey}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("another CA's key: %v, want invalid_argument", err)
	}
	if _, err := handedOver("sb", e, &v1.Handover{EgressCAKey: "garbage"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a key that is no PEM: %v, want invalid_argument", err)
	}
	got, err := handedOver("sb", e, &v1.Handover{EgressCAKey: key})
	if err != nil || got.CAKey != key || got.CACert != cert || got.Addr != e.Addr {
		t.Errorf("its own key: %+v, %v", got, err)
	}
	// Without inspection there is no key to hand over.
	plain := meta.Egress{Addr: e.Addr}
	if got, err := handedOver("sb", plain, nil); err != nil || got.CAKey != "" || got.Addr != plain.Addr {
		t.Errorf("no inspection: %+v, %v", got, err)
	}
}

// TestFetchTreeOverImage resumes from the store a sandbox whose tree
// differs a little from its image: over the image, the file it changed
// comes back as it left it. Then the image's bytes change under the
// index the first fetch built: the tree's hash refuses what the image
// gives, the fetch starts again whole, and the sandbox still resumes
// with its own files.
func TestFetchTreeOverImage(t *testing.T) {
	m := openManagerStore(t, testBucket(t))
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	// A mode changed: the file is written again, its bytes read from the
	// image (no longer the same entry); a file of its own.
	run(t, m, sb.ID, "chmod 0600 /etc/debian_version && echo mine > /root/mine")
	want := string(readFile(t, filepath.Join(m.sbRoot(sb.ID), "etc/debian_version")))
	resume := func() {
		t.Helper()
		if _, err := m.Hibernate(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Offload(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Resume(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		for p, w := range map[string]string{"etc/debian_version": want, "root/mine": "mine\n"} {
			if got := string(readFile(t, filepath.Join(m.sbRoot(sb.ID), p))); got != w {
				t.Fatalf("%s: %q after the resume, want %q", p, got, w)
			}
		}
		fi, err := os.Stat(filepath.Join(m.sbRoot(sb.ID), "etc/debian_version"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("etc/debian_version: %v, %v; want mode 0600", fi, err)
		}
	}
	trees := func(how string) float64 { return counterValue(m.metrics.treeFetches.WithLabelValues(how)) }
	resume()
	if trees("image") != 1 || trees("whole") != 0 {
		t.Fatalf("first resume: %v trees fetched over the image, %v whole; want 1 and 0", trees("image"), trees("whole"))
	}
	img := m.imageDir(testImage)
	if err := fsnap.SetReadonly(img, false); err != nil {
		t.Fatal(err)
	}
	tampered := strings.Repeat("x", len(want))
	if err := os.WriteFile(filepath.Join(img, "etc/debian_version"), []byte(tampered), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fsnap.SetReadonly(img, true); err != nil {
		t.Fatal(err)
	}
	resume()
	if trees("image_refused") != 1 || trees("whole") != 1 || trees("image") != 1 {
		t.Fatalf("second resume: %v refused over the image, %v whole, %v over it; want 1, 1 and 1", trees("image_refused"), trees("whole"), trees("image"))
	}
}

// TestClaimRace: two hosts that resume the same sandbox from the store
// at the same moment do not both get it: each claim writes the
// sandbox's document over the version it read, so one wins and the
// other is refused (conflict), round after round.
func TestClaimRace(t *testing.T) {
	bucket := testBucket(t)
	a, second := trustingHosts(t, bucket)
	b := second()
	ctx := context.Background()
	var rec sandboxRec
	rec.ID = "c1a1m0000001"
	forceDoc(t, a, remote.SandboxDoc{Sandbox: rec.ID, Head: "ck0000000001", Record: []byte(`{}`)})
	hosts := []*Manager{a, b}
	wins := make([]int, 2)
	for round := range 12 {
		errs := make([]error, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, m := range hosts {
			wg.Go(func() {
				<-start
				errs[i] = m.claim(ctx, rec)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: both hosts claimed the sandbox", round)
			case err == nil:
				winner = i
			case !errors.Is(err, errdefs.ErrConflict):
				t.Fatalf("round %d: host %d: %v", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no host claimed the sandbox: %v", round, errs)
		}
		wins[winner]++
		doc, err := a.store.Sandbox(ctx, rec.ID)
		if err != nil || doc.Owner != hosts[winner].cks.Keyring().KeyID() {
			t.Fatalf("round %d: the document's owner is %q (%v), want the winner's", round, doc.Owner, err)
		}
		hosts[winner].unclaim(ctx, rec.ID)
	}
	t.Logf("claims won: %v", wins)
}

// TestHandedNames: the names a migration's source hands over are taken
// only signed by the host that signed the sandbox's document, and only
// as signed.
func TestHandedNames(t *testing.T) {
	m := openManager(t)
	me := m.cks.Keyring().KeyID()
	names := []v1.ResolvedName{
		{Name: "pypi.org", Addr: "192.0.2.1", Expires: time.Now().Add(time.Hour).UTC()},
		{Name: "files.example", Addr: "2001:db8::1", Expires: time.Now().Add(time.Minute).UTC()},
	}
	sign := func(id string, ns []v1.ResolvedName) *v1.Handover {
		sig := m.cks.Keyring().SignBytes(namesSigned(id, ns))
		return &v1.Handover{Names: ns, NamesKey: sig.Key, NamesSignature: sig.Sig}
	}
	h := sign("sb0000000001", names)
	got, err := m.handedNames("sb0000000001", me, h)
	if err != nil || len(got) != 2 || got[0].Name != "pypi.org" || got[1].Addr != netip.MustParseAddr("2001:db8::1") {
		t.Fatalf("signed names: %+v, %v", got, err)
	}
	if got, err := m.handedNames("sb0000000001", me, nil); err != nil || got != nil {
		t.Fatalf("no handover: %+v %v", got, err)
	}
	if _, err := m.handedNames("sb0000000001", "ed25519:0123456789abcdef", h); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("names signed by another host than the document's: %v", err)
	}
	if _, err := m.handedNames("sb0000000002", me, h); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("names signed for another sandbox: %v", err)
	}
	forged := *h
	forged.Names = append([]v1.ResolvedName(nil), names...)
	forged.Names[0].Addr = "198.51.100.7"
	if _, err := m.handedNames("sb0000000001", me, &forged); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an address changed after signing: %v", err)
	}
	later := *h
	later.Names = append([]v1.ResolvedName(nil), names...)
	later.Names[1].Expires = later.Names[1].Expires.Add(time.Hour)
	if _, err := m.handedNames("sb0000000001", me, &later); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an expiry moved after signing: %v", err)
	}
}

// TestImagesIndexedAhead: a daemon with a store indexes its images in
// the background as it starts, under the key a resume's fetch over the
// image looks up (the UUID its snapshot names), so that the first
// resume here does not build the index.
func TestImagesIndexedAhead(t *testing.T) {
	m := openManagerStore(t, testBucket(t))
	ctx := context.Background()
	sb := newSandbox(t, m)
	cfg := m.cfg
	m.Close()
	m, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	tree := m.path("tmp", "tree-probe")
	base, unlock, err := m.treeBase(sb.ID, tree)
	if err != nil || base == nil {
		t.Fatalf("no base for the sandbox's image: %v", err)
	}
	unlock()
	defer removeTree(tree)
	eventually(t, "the image indexed", func() bool { return m.store.Indexed(base.Key) })
}
