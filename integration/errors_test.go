package integration

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestErrors(t *testing.T) {
	sb := newSandbox(t)
	other := newSandbox(t)
	otherCk := strings.TrimSpace(must(t, "checkpoint", other))
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"exec", "nosuchsandbox", "--", "true"}, "not found"},
		{[]string{"inspect", "nosuchsandbox"}, "not found"},
		{[]string{"rm", "nosuchsandbox"}, "not found"},
		{[]string{"checkpoint", "nosuchsandbox"}, "not found"},
		{[]string{"rollback", sb, "nosuchcheckpoint"}, "not found"},
		{[]string{"fork", "nosuchcheckpoint"}, "not found"},
		{[]string{"checkpoint", "rm", "nosuchcheckpoint"}, "not found"},
		{[]string{"rollback", sb, otherCk}, "belongs to sandbox"},
		{[]string{"checkpoint", sb, "--kind", "bogus"}, "want fs"},
		{[]string{"checkpoint", sb, "--kind", "auto", "--keep"}, "no --wait or --keep"},
		{[]string{"turn", "nosuchsandbox"}, "not found"},
		{[]string{"turn", sb, "--ignore", "relative/path"}, "absolute path pattern"},
		{[]string{"llm", sb, "--upstream", "ftp://example"}, "http(s)"},
		{[]string{"llm", sb, "--upstream", "http://127.0.0.1:1", "--gate", "sometimes"}, "want response or exec"},
		{[]string{"checkpoint", sb, "--label", "bad label"}, "label"},
		{[]string{"create", "nosuchimage"}, "not found"},
		{[]string{"create", image, "--name", "bad/name"}, "name"},
		{[]string{"resume", sb}, "not hibernated"},
		{[]string{"checkpoint", "verify", "nosuchcheckpoint"}, "not found"},
		{[]string{"fork", sb, "-n", "0"}, "n=0"},
		{[]string{"create", image, "--memory", "17179869184G"}, "bad size"},
	}
	for _, c := range cases {
		r := molt(t, c.args...)
		if c.want == "" {
			continue
		}
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("molt %s: exit %d stderr %q; want failure mentioning %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
	}
	// Duplicate names are refused and the refused create lists nothing.
	newSandbox(t, "--name", "dup")
	before := must(t, "ls")
	if r := molt(t, "create", image, "--name", "dup"); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("duplicate name: exit %d %q", r.code, r.stderr)
	}
	if after := must(t, "ls"); after != before {
		t.Fatalf("a refused create changed the list:\n%s\n%s", before, after)
	}
}

func writeTar(t *testing.T, path string, hdrs []*tar.Header) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Name))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(h.Name))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func TestHostileImportRefused(t *testing.T) {
	dir := t.TempDir()
	sentinel := filepath.Join(dir, "outside")
	cases := map[string][]*tar.Header{
		"dotdot":    {{Name: "../outside", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute":  {{Name: sentinel, Typeflag: tar.TypeReg, Mode: 0o644}},
		"hardlink":  {{Name: "x", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}},
		"symlink":   {{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "../../../../tmp"}},
		"device":    {{Name: "dev/sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o600}},
		"via-link":  {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: dir}, {Name: "l/outside", Typeflag: tar.TypeReg, Mode: 0o644}},
		"chardev":   {{Name: "mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o600}},
		"dotdotdir": {{Name: "a/../../outside", Typeflag: tar.TypeReg, Mode: 0o644}},
	}
	for name, hdrs := range cases {
		p := filepath.Join(dir, name+".tar")
		writeTar(t, p, hdrs)
		r := molt(t, "image", "import", "hostile-"+name, p)
		if r.code == 0 {
			t.Errorf("%s: hostile archive imported", name)
			continue
		}
		if !strings.Contains(r.stderr, "invalid") && !strings.Contains(r.stderr, "escapes") && !strings.Contains(r.stderr, "not allowed") && !strings.Contains(r.stderr, "symlink") {
			t.Errorf("%s: unclear error %q", name, r.stderr)
		}
		if _, err := os.Lstat(sentinel); err == nil {
			t.Fatalf("%s: wrote outside the image root", name)
		}
	}
	if ls := must(t, "image", "ls"); strings.Contains(ls, "hostile") {
		t.Fatalf("a refused import is listed:\n%s", ls)
	}
	// A benign archive imports.
	good := filepath.Join(dir, "good.tar")
	writeTar(t, good, []*tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "etc/abs", Typeflag: tar.TypeSymlink, Linkname: "/etc/motd"},
	})
	must(t, "image", "import", "benign", good)
	t.Cleanup(func() { molt(t, "image", "rm", "benign") })
	if r := molt(t, "image", "import", "benign", good); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("import over an existing image: exit %d %q", r.code, r.stderr)
	}
}

func TestImageBuildIsIdempotentPerOptions(t *testing.T) {
	// Same name and options: the cached image is returned at once.
	must(t, "image", "build", image)
	// Same name, other options: refused rather than silently reused.
	if r := molt(t, "image", "build", image, "--packages", "git"); r.code == 0 || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("build with other options over an existing image: exit %d %q", r.code, r.stderr)
	}
}
