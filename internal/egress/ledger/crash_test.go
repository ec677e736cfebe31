package ledger

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
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
