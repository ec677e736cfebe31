// Package integration runs molt end to end as a user does: the real molt
// binary as daemon and CLI, real btrfs (a loop pool), real cgroups and
// namespaces, and a real Debian image built with debootstrap (cached in
// $MOLT_CACHE_DIR, default /var/cache/molt, between runs and packages).
//
// The tests need root. Without it they skip, unless
// MOLT_REQUIRE_PRIVILEGED=1 (CI), where they fail.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/egress/netlab"
)

// env is the shared daemon of this package.
var env struct {
	bin    string // molt binary
	root   string // state root
	socket string
	log    string
	daemon *exec.Cmd
	lab    *netlab.Lab // the test internet sandboxes' egress leaves to
	// The daemon's TLS listener for tenants' tokens (tenant_test.go).
	listen, tlsDir string
	// kek is the file of the daemon's key-encryption key: encryption at
	// rest is on for every test; kekPrev the one being rotated out
	// (encrypt_test.go).
	kek, kekPrev string
}

// image is the Debian image every test uses.
const image = "debian"

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		if os.Getenv("MOLT_REQUIRE_PRIVILEGED") == "1" {
			fmt.Fprintln(os.Stderr, "integration tests need root and MOLT_REQUIRE_PRIVILEGED=1 forbids skipping")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "integration tests skipped: they need root")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "molt-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	env.bin = filepath.Join(tmp, "molt")
	env.root = filepath.Join(tmp, "root")
	env.socket = filepath.Join(tmp, "molt.sock")
	env.log = filepath.Join(tmp, "daemon.log")
	if b := os.Getenv("MOLT_TEST_BIN"); b != "" {
		// Another build of molt (an older commit, to show that a test
		// fails there).
		env.bin = b
	} else {
		build := exec.Command("go", "build", "-o", env.bin, "../cmd/molt")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build molt:", err)
			return 1
		}
	}
	// The sandboxes' "internet": a network namespace of the test's own
	// (egress never leaves the machine).
	if env.lab, err = netlab.Start(netlab.Options{Dir: tmp}); err != nil {
		fmt.Fprintln(os.Stderr, "test internet:", err)
		return 1
	}
	defer env.lab.Close()
	if env.kek, err = writeKEK(tmp, "kek"); err != nil {
		fmt.Fprintln(os.Stderr, "key-encryption key:", err)
		return 1
	}
	if env.listen, err = tlsSetup(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "TLS listener:", err)
		return 1
	}
	if err := startDaemon(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out, err := exec.Command(env.bin, "--socket", env.socket, "image", "build", image).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "image build: %v\n%s", err, tail(out, 4000))
		stopDaemon()
		return 1
	}
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintln(os.Stderr, "teardown:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func startDaemon() error {
	logf, err := os.OpenFile(env.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	args := []string{"daemon", "--root", env.root, "--socket", env.socket, "--pool-size", "16G"}
	if env.lab != nil {
		// Not for the upgrade test's older build, which has neither.
		// Compensations back off 50 ms, 100 ms (the default 500 ms
		// would make the failure tests slow).
		args = append(args, "--egress-uplink", env.lab.Name, "--egress-dns", env.lab.DNSAddr().String(), "--egress-ca", env.lab.CAFile,
			"--compensate-backoff", "50ms", "--compensate-timeout", "10s")
		if env.kek != "" {
			args = append(args, "--kek-file", env.kek)
		}
		if env.kekPrev != "" {
			args = append(args, "--kek-previous-file", env.kekPrev)
		}
		if env.listen != "" {
			args = append(args, "--listen", "tcp://"+env.listen, "--tls-cert", filepath.Join(env.tlsDir, "cert.pem"), "--tls-key", filepath.Join(env.tlsDir, "key.pem"))
		}
	}
	cmd := exec.Command(env.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	logf.Close()
	env.daemon = cmd
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if exec.Command(env.bin, "--socket", env.socket, "host").Run() == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(env.log)
	return fmt.Errorf("daemon did not come up:\n%s", tail(b, 4000))
}

func stopDaemon() {
	if env.daemon == nil {
		return
	}
	_ = env.daemon.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = env.daemon.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = env.daemon.Process.Kill()
		<-done
	}
	env.daemon = nil
}

// killDaemon kills the daemon with SIGKILL, as a crash would.
func killDaemon() {
	_ = env.daemon.Process.Kill()
	_ = env.daemon.Wait()
	env.daemon = nil
}

// teardown removes every sandbox, stops the daemon, unmounts the pool and
// checks that no loop device still holds it.
func teardown() error {
	var sbs []struct{ ID string }
	if out, err := exec.Command(env.bin, "--socket", env.socket, "--json", "ls").Output(); err == nil {
		_ = json.Unmarshal(out, &sbs)
	}
	for _, s := range sbs {
		_ = exec.Command(env.bin, "--socket", env.socket, "rm", s.ID).Run()
	}
	stopDaemon()
	pool := filepath.Join(env.root, "pool")
	if err := syscall.Unmount(pool, 0); err != nil {
		return fmt.Errorf("unmount pool: %w", err)
	}
	img := filepath.Join(env.root, "pool.img")
	deadline := time.Now().Add(5 * time.Second)
	for {
		held := loopHolding(img)
		if held == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("loop device %s still holds %s after unmount", held, img)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loopHolding returns the loop device backed by file, or "".
func loopHolding(file string) string {
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, d := range devs {
		b, err := os.ReadFile(d)
		if err == nil && strings.TrimSpace(string(b)) == file {
			return strings.Split(d, "/")[3]
		}
	}
	return ""
}

// result of one CLI run.
type result struct {
	stdout, stderr string
	code           int
}

// molt runs the CLI with stdin from stdin (may be nil).
func moltIn(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return moltAt(t, env.socket, stdin, args...)
}

// moltAt runs the CLI against the daemon of socket.
func moltAt(t *testing.T, socket, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.bin, append([]string{"--socket", socket}, args...)...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	r := result{stdout: so.String(), stderr: se.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("molt %v: %v", args, err)
	}
	return r
}

func molt(t *testing.T, args ...string) result {
	t.Helper()
	return moltIn(t, "", args...)
}

// must runs the CLI and fails the test unless it exits 0.
func must(t *testing.T, args ...string) string {
	t.Helper()
	r := molt(t, args...)
	if r.code != 0 {
		t.Fatalf("molt %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// mustJSON runs the CLI with --json and decodes stdout into v.
func mustJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := must(t, append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("molt %s: decode %q: %v", strings.Join(args, " "), out, err)
	}
}

// newSandbox creates a sandbox and removes it when the test ends.
func newSandbox(t *testing.T, args ...string) string {
	t.Helper()
	id := strings.TrimSpace(must(t, append([]string{"create", image}, args...)...))
	t.Cleanup(func() {
		if r := molt(t, "rm", id); r.code != 0 && !strings.Contains(r.stderr, "not found") {
			t.Errorf("rm %s: %s", id, r.stderr)
		}
	})
	return id
}

// sh runs a shell command in the sandbox and returns stdout; it fails
// the test on a non-zero exit.
func sh(t *testing.T, sb, script string) string {
	t.Helper()
	return must(t, "exec", sb, "--", "bash", "-c", script)
}
