// The recovery benchmark's surroundings: the payment service in the test
// internet, and molt's daemon as a process of its own (so a crash can
// kill -9 it and a restart can find its state).

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/egress/netlab"
)

// paymentsIP is the payment service's address in the lab (TEST-NET-3,
// next to the lab's own hosts).
const paymentsIP = "203.0.113.30"

// Payments counts, per run, each logical effect it was paid for; the
// Idempotency-Key is not looked at (a regenerated key is a new payment
// to a service, as to most).
type Payments struct {
	mu     sync.Mutex
	counts map[string]map[string]int // +checklocks:mu
}

func newPayments() *Payments { return &Payments{counts: map[string]map[string]int{}} }

// Counts returns run's counts.
func (p *Payments) Counts(run string) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for e, n := range p.counts[run] {
		out[e] = n
	}
	return out
}

func (p *Payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/pay" {
		http.NotFound(w, r)
		return
	}
	var body struct {
		Run    string `json:"run"`
		Effect string `json:"effect"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil || body.Run == "" || body.Effect == "" {
		http.Error(w, "want a JSON body with run and effect", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	if p.counts[body.Run] == nil {
		p.counts[body.Run] = map[string]int{}
	}
	p.counts[body.Run][body.Effect]++
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"effect": %q, "status": "paid"}`+"\n", body.Effect)
}

// startLab starts the test internet with the payment service in it.
func startLab(dir string) (*netlab.Lab, *Payments, error) {
	lab, err := netlab.Start(netlab.Options{Dir: dir, Hosts: map[string]netip.Addr{PaymentsName: netip.MustParseAddr(paymentsIP)}})
	if err != nil {
		return nil, nil, err
	}
	ln, err := lab.Listen("tcp4", paymentsIP+":80")
	if err != nil {
		lab.Close()
		return nil, nil, err
	}
	p := newPayments()
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = srv.Serve(ln) }() // ends when the lab closes the listener
	return lab, p, nil
}

// daemonProc is molt's daemon run from the molt binary, on a state root
// of its own, with egress through the lab.
type daemonProc struct {
	bin, root, sock, log, cacheDir string
	lab                            *netlab.Lab
	cmd                            *exec.Cmd
	waitCh                         chan error // cmd.Wait's result
	c                              *client.Client
}

func (d *daemonProc) start(ctx context.Context) error {
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(d.bin, "daemon", "--root", d.root, "--socket", d.sock, "--pool-size", "16G", "--cache-dir", d.cacheDir,
		"--egress-uplink", d.lab.Name, "--egress-dns", d.lab.DNSAddr().String(), "--egress-ca", d.lab.CAFile)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	d.cmd = cmd
	d.c = client.New(d.sock)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			d.cmd = nil
			return fmt.Errorf("daemon exited: %v\n%s", err, tailFile(d.log, 3000))
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := d.c.Host(cctx)
		cancel()
		if err == nil {
			d.waitCh = exited // cmd.Wait runs in the goroutine
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	d.cmd = nil
	return fmt.Errorf("daemon did not come up in 2 minutes:\n%s", tailFile(d.log, 3000))
}

// kill is the crash: SIGKILL, and the process reaped.
func (d *daemonProc) kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.waitCh
	d.cmd = nil
}

// stop ends the daemon with SIGTERM (SIGKILL after 30 s).
func (d *daemonProc) stop() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(unix.SIGTERM)
	select {
	case <-d.waitCh:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.waitCh
	}
	d.cmd = nil
}

// teardown removes every sandbox, stops the daemon and unmounts its pool.
func (d *daemonProc) teardown() error {
	if d.cmd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if sbs, err := d.c.Sandboxes(ctx); err == nil {
			for _, s := range sbs {
				_ = d.c.Remove(ctx, s.ID)
			}
		}
		cancel()
	}
	d.stop()
	pool := filepath.Join(d.root, "pool")
	var err error
	for range 50 {
		if err = unix.Unmount(pool, 0); err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			err = nil
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", pool, err)
	}
	return os.RemoveAll(d.root)
}

func tailFile(p string, n int) string {
	b, _ := os.ReadFile(p)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// agentProc is a running recovery-agent process.
type agentProc struct {
	cmd    *exec.Cmd
	paused chan struct{} // closed when the agent says "paused"
	done   chan error
	stderr *strings.Builder
}

// startAgent starts `bin bench recovery-agent --spec FILE`.
func startAgent(bin, specFile string) (*agentProc, error) {
	cmd := exec.Command(bin, "bench", "recovery-agent", "--spec", specFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	a := &agentProc{cmd: cmd, paused: make(chan struct{}), done: make(chan error, 1), stderr: &strings.Builder{}}
	cmd.Stderr = &syncWriter{w: a.stderr}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		b := make([]byte, 64)
		var seen strings.Builder
		for {
			n, err := out.Read(b)
			seen.Write(b[:n])
			if strings.Contains(seen.String(), "paused") {
				close(a.paused)
				_, _ = io.Copy(io.Discard, out)
				break
			}
			if err != nil {
				break
			}
		}
		a.done <- cmd.Wait()
	}()
	return a, nil
}

// kill is the agent's crash: SIGKILL, and the process reaped.
func (a *agentProc) kill() {
	_ = a.cmd.Process.Kill()
	<-a.done
}

// syncWriter serializes writes to w (exec.Cmd copies stderr from a
// goroutine of its own).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer // +checklocks:mu
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}
