package daemon

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/testutil"
)

// dialEnv makes the test binary a client of the socket it names: it
// prints what an HTTP request there returns (run as another uid).
const dialEnv = "MOLT_TEST_DIAL_SOCKET"

func dialHelper(path string) int {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		fmt.Printf("dial: %v\n", err)
		return 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	b, _ := io.ReadAll(c)
	fmt.Printf("reply: %q\n", b)
	return 0
}

// TestSocketAppearsWithItsMode: the socket is never created at its
// path: it is bound in a private 0700 directory and renamed into place
// with its final mode, so no one can connect in a window before a chmod.
// The directory's events show it: the path only ever arrives by rename.
func TestSocketAppearsWithItsMode(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	// A permissive umask, as a daemon might inherit.
	old := unix.Umask(0)
	path := filepath.Join(dir, "molt.sock")
	ln, err := Listen(path)
	unix.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a 0600 socket", fi.Mode())
	}
	buf := make([]byte, 64<<10)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatal(err)
	}
	var sawPriv bool
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		ev := (*unix.InotifyEvent)(unsafePointer(&buf[off]))
		name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
		off += unix.SizeofInotifyEvent + int(ev.Len)
		switch {
		case name == "molt.sock" && ev.Mask&unix.IN_CREATE != 0:
			t.Fatalf("the socket was created at its path (a window before its chmod)")
		case name == "molt.sock" && ev.Mask&unix.IN_MOVED_TO != 0:
		case strings.HasPrefix(name, ".molt-sock-") && ev.Mask&unix.IN_ISDIR != 0:
			sawPriv = true
		default:
			t.Fatalf("unexpected event %#x for %q", ev.Mask, name)
		}
	}
	if !sawPriv {
		t.Fatalf("no private directory was used")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("left in the directory: %v", ents)
	}
}

// TestSocketRefusesOtherUIDs: a peer that is neither root nor allowed
// is disconnected and logged, even when it can reach the socket file (a
// socket exposed by mistake, or bind-mounted elsewhere); an allowed uid
// gets through.
func TestSocketRefusesOtherUIDs(t *testing.T) {
	testutil.RequireRoot(t)
	const nobody = 65534
	// A directory the other uid can traverse, holding a copy of this
	// test binary it can run.
	dir, err := os.MkdirTemp("", "molt-socktest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	dial := func(path string, uid int) string {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), dialEnv+"="+path)
		if uid != 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: nobody}}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("client as uid %d: %v: %s", uid, err, out)
		}
		return string(out)
	}
	for _, tc := range []struct {
		name   string
		access SocketAccess
		ok     bool
	}{
		{"refused", SocketAccess{Group: -1}, false},
		{"allowed uid", SocketAccess{Group: -1, UIDs: []int{nobody}}, true},
		{"allowed group", SocketAccess{Group: nobody}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logBuf syncBuf
			log := slog.New(slog.NewTextHandler(&logBuf, nil))
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".sock")
			ln, err := ListenAccess(path, tc.access, log)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") })}
			go srv.Serve(ln)
			defer srv.Close()
			if got := dial(path, 0); !strings.Contains(got, "served") {
				t.Fatalf("root: %s", got)
			}
			// The file's permission is not what stops the peer here.
			if err := os.Chmod(path, 0o666); err != nil {
				t.Fatal(err)
			}
			got := dial(path, nobody)
			if tc.ok != strings.Contains(got, "served") {
				t.Fatalf("uid %d (allowed: %v): %s (log: %s)", nobody, tc.ok, got, logBuf.String())
			}
			refused := strings.Contains(logBuf.String(), "connection refused") && strings.Contains(logBuf.String(), "uid=65534")
			if refused == tc.ok {
				t.Fatalf("log: %q", logBuf.String())
			}
		})
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func unsafePointer(b *byte) unsafe.Pointer { return unsafe.Pointer(b) }
