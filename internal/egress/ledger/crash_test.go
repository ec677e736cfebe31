package ledger

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const crashChild = "MOLT_LEDGER_CRASH_DIR"

// crashDaemon is the process TestCrashPending kills: it records a
// pending effect, then keeps appending, printing each record's ID once
// Begin has returned, until it is killed.
func crashDaemon(dir string) {
	l, err := Open(dir)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	r, err := l.Begin("sb", Record{Kind: Effect, Request: post("/charge", `{"amount":5}`)})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println(r.ID)
	for i := 0; ; i++ {
		k := Read
		if i%3 == 0 {
			k = Effect
		}
		r, err := l.Begin("sb", Record{Kind: k, Request: get(fmt.Sprintf("/%d", i))})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Println(r.ID)
	}
}

// TestCrashPending kills a process between the Begin of an effect and
// its Finish: after reopening, the effect is pending (its outcome is
// unknown, so an equivalent request is refused), and every record whose
// Begin returned before the kill is there.
func TestCrashPending(t *testing.T) {
	if dir := os.Getenv(crashChild); dir != "" {
		crashDaemon(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashPending$")
	cmd.Env = append(os.Environ(), crashChild+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var acked []string
	for len(acked) < 300 && sc.Scan() {
		if len(sc.Text()) != 16 {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child: %s", sc.Text())
		}
		acked = append(acked, sc.Text())
	}
	cmd.Process.Signal(syscall.SIGKILL)
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed: %v (%d records acknowledged)", err, len(acked))
	}
	if len(acked) == 0 {
		t.Fatal("the child acknowledged no record")
	}

	l := open(t, dir)
	for _, id := range acked {
		if _, ok := l.Get("sb", id); !ok {
			t.Fatalf("record %s, acknowledged before the kill, is missing", id)
		}
	}
	r, ok := l.Get("sb", acked[0])
	if !ok || r.State != Pending || r.Seq != 1 {
		t.Fatalf("the effect after the crash: %+v", r)
	}
	if m := l.Match("sb", post("/charge", `{"amount":5}`)); m.Pending == nil || m.Pending.ID != acked[0] {
		t.Fatalf("match after the crash: %+v", m)
	}
	list, _ := l.List("sb", "")
	t.Logf("%d records acknowledged, %d on disk, repairs %+v", len(acked), len(list), l.Repairs())
	if _, err := l.Begin("sb", Record{Kind: Effect, Request: post("/after", "")}); err != nil {
		t.Fatalf("Begin after the crash: %v", err)
	}
}

const fullChild = "MOLT_LEDGER_FULL_DIR"

// TestWriteFailureCutBack fills the file size limit in the middle of an
// append (as a full disk would): Begin fails, the partial line is cut
// away, and the next Begin, once there is room, writes a file that
// opens cleanly.
func TestWriteFailureCutBack(t *testing.T) {
	if dir := os.Getenv(fullChild); dir != "" {
		fullDaemon(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestWriteFailureCutBack$", "-test.v")
	cmd.Env = append(os.Environ(), fullChild+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	l := open(t, dir)
	list, err := l.List("sb", "")
	if err != nil || len(list) != 2 || len(l.Repairs()) != 0 {
		t.Fatalf("after the failed write: %d records (%v), repairs %+v; want 2 and none", len(list), err, l.Repairs())
	}
}

// fullDaemon runs in a child process: RLIMIT_FSIZE is per process.
func fullDaemon(t *testing.T, dir string) {
	l := open(t, dir)
	begin(t, l, "sb", Record{Kind: Effect, Request: post("/1", "1")})
	fi, err := os.Stat(filepath.Join(dir, "sb.ledger"))
	if err != nil {
		t.Fatal(err)
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	// The Go runtime ignores SIGXFSZ: the write fails with EFBIG.
	lim := unix.Rlimit{Cur: uint64(fi.Size()) + 40, Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	_, err = l.Begin("sb", Record{Kind: Effect, Request: post("/2", "2")})
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, unix.EFBIG) {
		t.Fatalf("Begin past the size limit: %v, want EFBIG", err)
	}
	if fi2, _ := os.Stat(filepath.Join(dir, "sb.ledger")); fi2.Size() != fi.Size() {
		t.Fatalf("file is %d bytes after the failed write, want %d", fi2.Size(), fi.Size())
	}
	r := begin(t, l, "sb", Record{Kind: Effect, Request: post("/3", "3")})
	if r.Seq != 2 {
		t.Fatalf("record after the failed write has seq %d, want 2", r.Seq)
	}
}
