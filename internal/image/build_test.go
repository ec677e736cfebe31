package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

func TestCacheKey(t *testing.T) {
	base := CacheKey(BuildOptions{})
	if len(base) != 64 {
		t.Errorf("key %q is not a hex SHA-256", base)
	}
	for _, o := range []BuildOptions{
		{Suite: "bookworm", Mirror: "http://deb.debian.org/debian", CacheDir: "/elsewhere", Log: io.Discard},
		{Packages: []string{"bash", "python3"}},
	} {
		if k := CacheKey(o); k != base {
			t.Errorf("CacheKey(%+v) = %s, want the defaults' %s", o, k, base)
		}
	}
	if a, b := CacheKey(BuildOptions{Packages: []string{"vim", "git"}}), CacheKey(BuildOptions{Packages: []string{"git", "vim", "git"}}); a != b {
		t.Errorf("package order or duplicates change the key: %s != %s", a, b)
	}
	for _, o := range []BuildOptions{
		{Suite: "trixie"},
		{Packages: []string{"git"}},
		{Mirror: "http://ftp.de.debian.org/debian"},
	} {
		if CacheKey(o) == base {
			t.Errorf("CacheKey(%+v) equals the defaults' key", o)
		}
	}
}

func TestBuildRefusesBadOptions(t *testing.T) {
	for _, o := range []BuildOptions{
		{Suite: "--foreign"},
		{Suite: "bookworm main"},
		{Packages: []string{"git,--keyring=/x"}},
		{Packages: []string{"-x"}},
		{Mirror: "ftp://deb.debian.org/debian"},
		{Mirror: "http:///debian"},
	} {
		o.CacheDir = t.TempDir()
		dst := t.TempDir()
		if err := Build(t.Context(), o, dst); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Build(%+v) = %v, want ErrInvalidArgument", o, err)
		}
		if names := dirNames(t, o.CacheDir); len(names) != 0 {
			t.Errorf("Build(%+v) wrote %v to the cache", o, names)
		}
	}
}

func cacheDir() string {
	if d := os.Getenv("MOLT_CACHE_DIR"); d != "" {
		return d
	}
	return "/var/cache/molt"
}

func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: Build runs debootstrap (about 90 s, needs a Debian mirror) unless its tree is cached")
	}
	testutil.RequireRoot(t)
	var log bytes.Buffer
	opts := BuildOptions{CacheDir: cacheDir(), Log: io.MultiWriter(t.Output(), &log)}

	first := t.TempDir()
	start := time.Now()
	if err := Build(t.Context(), opts, first); err != nil {
		t.Fatal(err)
	}
	t.Logf("first Build: %s", time.Since(start))
	for _, p := range []string{"usr/bin/python3", "bin/bash", "usr/bin/ps"} {
		if _, err := os.Stat(filepath.Join(first, p)); err != nil {
			t.Errorf("tree lacks %s: %v", p, err)
		}
	}
	if names := dirNames(t, filepath.Join(first, "dev")); len(names) != 0 {
		t.Errorf("dev is not empty: %v", names)
	}
	for _, d := range []string{"var/lib/apt/lists", "var/cache/apt/archives"} {
		for _, n := range dirNames(t, filepath.Join(first, d)) {
			if fi, _ := os.Lstat(filepath.Join(first, d, n)); !fi.IsDir() {
				t.Errorf("%s/%s was not removed", d, n)
			}
		}
	}
	noMountsUnder(t, first)
	if _, err := os.Stat(filepath.Join(opts.CacheDir, "debootstrap", CacheKey(opts)+".tar")); err != nil {
		t.Errorf("no cache file: %v", err)
	}

	log.Reset()
	second := t.TempDir()
	start = time.Now()
	if err := Build(t.Context(), opts, second); err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	t.Logf("second Build: %s", d)
	if d > 30*time.Second || !strings.Contains(log.String(), "importing cached tree") {
		t.Errorf("second Build took %s and logged %q; want a cache import under 30 s", d, log.String())
	}
	compareTrees(t, first, second, true)
}

func TestBuildFailureLeavesNoCacheFile(t *testing.T) {
	testutil.RequireRoot(t)
	opts := BuildOptions{CacheDir: t.TempDir(), Mirror: "http://127.0.0.1:9/debian", Log: t.Output()}
	dst := t.TempDir()
	if err := Build(t.Context(), opts, dst); err == nil {
		t.Fatal("Build from an unreachable mirror succeeded")
	}
	noMountsUnder(t, dst)
	if names := dirNames(t, opts.CacheDir); len(names) != 0 {
		t.Errorf("cache dir holds %v after a failed Build", names)
	}
}

func TestBuildCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a real debootstrap from the network")
	}
	testutil.RequireRoot(t)
	opts := BuildOptions{CacheDir: t.TempDir(), Log: t.Output()}
	dst := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := Build(ctx, opts, dst); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Build returned %s after its deadline", d-5*time.Second)
	}
	noMountsUnder(t, dst)
	if names := dirNames(t, opts.CacheDir); len(names) != 0 {
		t.Errorf("cache dir holds %v after a cancelled Build", names)
	}
	// No process of the build may survive it.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(dst)) {
			t.Errorf("%s still runs: %q", filepath.Dir(p), bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}

func noMountsUnder(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir) {
			t.Errorf("%s is still mounted", fields[4])
		}
	}
}
