package core

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// openManagerTrusting opens a manager of a root of its own that trusts
// the host keys in the files pubs.
func openManagerTrusting(t testing.TB, pubs ...string) *Manager {
	t.Helper()
	return openManagerConfig(t, Config{Root: t.TempDir(), TrustedKeys: pubs})
}

// exportTo exports checkpoint ck of m into a file.
func exportTo(t *testing.T, m *Manager, ck string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "ck.molt")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := m.ExportCheckpoint(context.Background(), ck, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bundle of %s: %+v", ck, st)
	return file
}

func importFile(m *Manager, file string) (string, error) { return importFileFor(m, file, "") }

func importFileFor(m *Manager, file, tenant string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	res, err := m.ImportCheckpoint(context.Background(), bufio.NewReader(f), tenant)
	return res.Checkpoint.ID, err
}

// flipInObject copies the bundle file with one byte of its first page
// image flipped.
func flipInObject(t *testing.T, file string) string {
	t.Helper()
	in, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	outName := file + ".bad"
	out, err := os.Create(outName)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	flipped := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if !flipped && strings.HasPrefix(h.Name, "objects/images/pages-") && h.Size > 100 {
			b, _ := io.ReadAll(tr)
			b[h.Size/2] ^= 0x40
			tw.Write(b)
			flipped = true
			continue
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if !flipped {
		t.Fatal("no page image to flip a byte of")
	}
	tw.Close()
	return outName
}

// TestCheckpointBundle: a full checkpoint exported from one daemon's
// root and imported into another's forks there with its files, its
// session's state and its running process; a tampered bundle and one
// signed by a key the host does not trust are refused, leaving nothing.
func TestCheckpointBundle(t *testing.T) {
	a := openManager(t)
	requireCRIU(t, a)
	b := openManagerTrusting(t, filepath.Join(a.cfg.Root, "keys", "host.pub"))
	ctx := context.Background()
	// The sandboxes of both go before either pool is unmounted: a
	// sandbox's mount namespace holds a copy of the other's pool.
	t.Cleanup(func() {
		for _, m := range []*Manager{b, a} {
			sbs, _ := m.Sandboxes()
			for _, s := range sbs {
				if err := m.Remove(ctx, s.ID); err != nil {
					t.Errorf("remove %s: %v", s.ID, err)
				}
			}
		}
	})
	sb := newSandbox(t, a)
	run(t, a, sb.ID, "export X=42; cd /tmp; echo hello > /root/f")
	if _, _, err := a.Exec(ctx, sb.ID, v1.ExecRequest{Detach: true, Args: []string{"sh", "-c", "echo $$ > /tmp/pid; exec sleep 100000"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the detached command wrote /tmp/pid", func() bool { return run(t, a, sb.ID, "test -s /tmp/pid && echo y").Stdout == "y\n" })
	ck, err := a.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	file := exportTo(t, a, ck.ID)

	bad := flipInObject(t, file)
	if _, err := importFile(b, bad); err == nil || !strings.Contains(err.Error(), "failed verification") || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("import of a bundle with a flipped byte: %v", err)
	}
	if e := entries(t, b.path("checkpoints")); len(e) != 0 {
		t.Fatalf("a refused import left %v", e)
	}
	if e := entries(t, b.path("tmp")); len(e) != 0 {
		t.Fatalf("a refused import left staging %v", e)
	}
	cut := file + ".cut"
	whole, _ := os.ReadFile(file)
	if err := os.WriteFile(cut, whole[:len(whole)*2/3], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := importFile(b, cut); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("import of a truncated bundle: %v", err)
	}

	if _, err := importFileFor(b, file, "nosuch"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("import for a tenant that does not exist: %v", err)
	}
	if err := b.db.Put(meta.Tenants, "acme", meta.TenantRecord{Name: "acme", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	id, err := importFileFor(b, file, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if imp, err := b.ImportedCheckpoints("acme"); err != nil || len(imp) != 1 || imp[0].ID != id {
		t.Fatalf("acme's imported checkpoints: %v %+v", err, imp)
	}
	info, err := b.CheckpointInfo(id)
	if err != nil {
		t.Fatal(err)
	}
	if info.ImportedFrom != ck.ID || info.ImportSigner != a.cks.Keyring().KeyID() || info.Parent != "" {
		t.Fatalf("imported checkpoint: %+v", info)
	}
	if _, err := b.VerifyCheckpoint(id); err != nil {
		t.Fatal(err)
	}
	fr, err := b.Fork(ctx, id, v1.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	f := fr.Sandboxes[0].ID
	if fr.Sandboxes[0].Tenant != "acme" {
		t.Fatalf("fork of acme's imported checkpoint: tenant %q", fr.Sandboxes[0].Tenant)
	}
	if r := run(t, b, f, `echo $X; pwd; cat /root/f; kill -0 "$(cat /tmp/pid)" && echo alive`); r.Stdout != "42\n/tmp\nhello\nalive\n" {
		t.Fatalf("fork of the imported checkpoint: %+v", r)
	}

	// The other way: b's key is not one a trusts.
	fck, err := b.Checkpoint(ctx, f, v1.CheckpointRequest{Kind: v1.KindFS})
	if err != nil {
		t.Fatal(err)
	}
	back := exportTo(t, b, fck.ID)
	if _, err := importFile(a, back); err == nil || !errors.Is(err, ckstore.ErrUntrusted) || !strings.Contains(err.Error(), "untrusted key "+b.cks.Keyring().KeyID()) {
		t.Fatalf("import signed by an untrusted key: %v", err)
	}
}
