package turn

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/inspect"
	"github.com/molt-sh/molt/internal/meta"
)

func TestSamePos(t *testing.T) {
	for _, c := range []struct {
		name, frozen, now string
		want              bool
	}{
		{"same", "7:0x10,0x400 8:0x20,0x500 ", "7:0x10,0x400 8:0x20,0x500 ", true},
		{"syscall restarted", "7:0x10,0x400 ", "7:0x10,0x402 ", true},
		{"one byte on", "7:0x10,0x400 ", "7:0x10,0x401 ", false},
		{"pointer moved on", "7:0x10,0x400 ", "7:0x10,0x404 ", false},
		{"pointer moved back", "7:0x10,0x402 ", "7:0x10,0x400 ", false},
		{"stack moved", "7:0x10,0x400 ", "7:0x18,0x402 ", false},
		{"thread started", "7:0x10,0x400 ", "7:0x10,0x400 9:0x30,0x600 ", false},
		{"running now", "7:0x10,0x400 ", "7:running ", false},
		{"garbage", "7:0x10,zz ", "7:0x10,0x402 ", false},
	} {
		if got := samePos(c.frozen, c.now); got != c.want {
			t.Errorf("%s: samePos(%q, %q) = %v, want %v", c.name, c.frozen, c.now, got, c.want)
		}
	}
}

func TestMergeEffects(t *testing.T) {
	a := inspect.Effects{
		Files:   []inspect.FileEffect{{Path: "/a", Ops: []string{"write"}}, {Path: "/b", FS: "btrfs", Ops: []string{"create"}}},
		Unknown: []string{"mount"},
		Lost:    1,
	}
	b := inspect.Effects{
		Files:     []inspect.FileEffect{{Path: "/a", FS: "btrfs", Ops: []string{"write", "truncate"}}},
		Processes: []inspect.ProcEffect{{Op: "spawn", Pid: 3}},
		Unknown:   []string{"mount", "io_uring"},
		Lost:      2,
	}
	got := mergeEffects(a, b)
	want := inspect.Effects{
		Files:     []inspect.FileEffect{{Path: "/a", FS: "btrfs", Ops: []string{"write", "truncate"}}, {Path: "/b", FS: "btrfs", Ops: []string{"create"}}},
		Processes: []inspect.ProcEffect{{Op: "spawn", Pid: 3}},
		Unknown:   []string{"mount", "io_uring"},
		Lost:      3,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merge:\n got %+v\nwant %+v", got, want)
	}
	if a.Files[0].Ops[0] != "write" || len(a.Files[0].Ops) != 1 {
		t.Fatalf("merge changed its input: %+v", a.Files[0])
	}
}

func TestChanges(t *testing.T) {
	sess := sessionChanges(map[string]string{"a": "1", "b": "2", "c": "3"}, map[string]string{"a": "1", "b": "9", "d": "4"})
	wantSess := []meta.SessionChange{{Name: "b", Change: "changed"}, {Name: "c", Change: "closed"}, {Name: "d", Change: "created"}}
	if !reflect.DeepEqual(sess, wantSess) {
		t.Errorf("sessions: %+v, want %+v", sess, wantSess)
	}
	before := map[int]procInfo{
		1:  {start: 1, role: roleInit, cpu: 5},
		10: {start: 7, comm: "idle", cpu: 100, slices: 3},
		11: {start: 7, comm: "busy", cpu: 100, slices: 3},
		12: {start: 7, comm: "gone"},
		13: {start: 7, comm: "reused"},
		14: {start: 7, comm: "bash", role: roleSession},
	}
	now := map[int]procInfo{
		1:  {start: 1, role: roleInit, cpu: 99}, // init is not long-lived
		10: {start: 7, comm: "idle", cpu: 100, slices: 3},
		11: {start: 7, comm: "busy", cpu: 100, slices: 4},
		13: {start: 8, comm: "reused"},
		14: {start: 7, comm: "bash"}, // a closed session's shell
		15: {start: 9, comm: "new", running: true},
	}
	got := longLivedChanges(before, now)
	want := []meta.LongLivedChange{
		{Pid: 11, Comm: "busy", Change: "ran"},
		{Pid: 12, Comm: "gone", Change: "exited"},
		{Pid: 13, Comm: "reused", Change: "started"},
		{Pid: 13, Comm: "reused", Change: "exited"},
		{Pid: 15, Comm: "new", Change: "started"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("long-lived:\n got %+v\nwant %+v", got, want)
	}
}

// readProc parses this test's own /proc entry: its threads are counted,
// its start time is that of /proc/self/stat.
func TestReadProcSelf(t *testing.T) {
	p, nspid, _, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.start == 0 || p.comm == "" || p.cpu == 0 || nspid == 0 {
		t.Fatalf("readProc(self) = %+v nspid %d", p, nspid)
	}
	if n := strings.Count(p.pos, ":"); n < 1 {
		t.Fatalf("no thread positions: %q", p.pos)
	}
}

func frame(typ byte, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

func newTracker(t *testing.T) *Tracker {
	t.Helper()
	db, err := meta.Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tr := New(Config{DB: db})
	t.Cleanup(tr.Close)
	return tr
}

// The recording parses frames split anywhere, keeps each stream whole
// within the sandbox's recording limit (past it the command is cut, and
// keeps 64 KiB for reading), and does not buffer a frame over the
// stream's limit.
func TestRecording(t *testing.T) {
	exit, _ := json.Marshal(v1.ExitStatus{ExitCode: 3})
	big := strings.Repeat("x", keepOutput+100)
	huge := strings.Repeat("y", 3*keepOutput)
	for _, c := range []struct {
		name   string
		stream []byte
		stdout string
		stderr string
		code   int
		cut    bool
	}{
		{"plain", append(append(frame(v1.FrameStdout, []byte("out")), frame(v1.FrameStderr, []byte("err"))...), frame(v1.FrameExit, exit)...), "out", "err", 3, false},
		{"whole", append(frame(v1.FrameStdout, []byte(big)), frame(v1.FrameExit, exit)...), big, "", 3, false},
		{"over the limit", append(frame(v1.FrameStdout, []byte(huge)), frame(v1.FrameExit, exit)...), huge[:keepOutput], "", 3, true},
		{"oversized frame", append(frame(v1.FrameStdout, []byte("a")), 1, 0xff, 0xff, 0xff, 0xff), "a", "", -1, false},
		{"cut short", frame(v1.FrameStdout, []byte("abc"))[:6], "", "", -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newTracker(t)
			tr.cfg.RecordLimit = func(string) int64 { return 2 * keepOutput }
			ts := &state{}
			tr.m["s"] = ts
			a, b := net.Pipe()
			rc := tr.Recording("s", a, meta.TurnCommand{Args: []string{"echo"}})
			go func() {
				// Written in 3-byte pieces: frames arrive split.
				for s := c.stream; len(s) > 0; s = s[min(3, len(s)):] {
					b.Write(s[:min(3, len(s))])
				}
				b.Close()
			}()
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Fatal(err)
			}
			if n := len(rc.(*recConn).buf); c.name == "oversized frame" && n > 0 {
				t.Fatalf("%d bytes held after a frame over the limit", n)
			}
			rc.Close()
			rc.Close() // recorded once
			if len(ts.commands) != 1 {
				t.Fatalf("%d commands recorded", len(ts.commands))
			}
			got := ts.commands[0]
			if got.Stdout != c.stdout || got.Stderr != c.stderr || got.ExitCode != c.code || got.Cut != c.cut || got.Args[0] != "echo" {
				t.Fatalf("recorded stdout %d bytes, stderr %q, exit %d, cut %v", len(got.Stdout), got.Stderr, got.ExitCode, got.Cut)
			}
		})
	}
}

// The log lists a sandbox's turns in order (not another sandbox's whose
// ID it prefixes), and an LLM call lands on the turn it ended.
func TestLog(t *testing.T) {
	tr := newTracker(t)
	for _, r := range []struct {
		id string
		n  int
	}{{"s", 2}, {"s", 10}, {"s", 1}, {"s2", 5}} {
		tr.record(meta.TurnRecord{TurnResult: meta.TurnResult{Sandbox: r.id, Turn: r.n, Decision: v1.DecisionNone}})
	}
	l, err := tr.Log("s")
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, r := range l {
		got = append(got, r.Turn)
	}
	if !reflect.DeepEqual(got, []int{1, 2, 10}) {
		t.Fatalf("turns %v, want [1 2 10]", got)
	}
	if n := tr.lastTurn("s"); n != 10 {
		t.Fatalf("last turn %d, want 10", n)
	}
	if err := tr.RecordLLM("s", 2, meta.LLMCall{Model: "m"}); err != nil {
		t.Fatal(err)
	}
	if l, _ := tr.Log("s"); len(l[1].LLM) != 1 || l[1].LLM[0].Model != "m" || len(l[0].LLM) != 0 {
		t.Fatalf("LLM call not on turn 2: %+v", l)
	}
	if err := tr.RecordLLM("s", 3, meta.LLMCall{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("LLM call on an unlogged turn: %v", err)
	}
	if err := tr.SetIgnore("s", []string{"tmp"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("relative ignore pattern: %v", err)
	}
	if err := tr.SetIgnore("s", []string{"/tmp/**"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("ignore list of a sandbox without turns: %v", err)
	}
}

// A command waits (Gate) while an asynchronous turn end runs; Close
// cancels it and waits for it, and nothing starts after.
func TestAsyncGateClose(t *testing.T) {
	tr := newTracker(t)
	tr.m["s"] = &state{}
	started := make(chan struct{})
	out := tr.Async("s", func(ctx context.Context) (meta.TurnResult, error) {
		close(started)
		<-ctx.Done()
		return meta.TurnResult{}, ctx.Err()
	})
	<-started
	cctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := tr.Gate(cctx, "s"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("gate during a turn end: %v", err)
	}
	if err := tr.Gate(context.Background(), "other"); err != nil {
		t.Fatalf("gate of a sandbox without turns: %v", err)
	}
	tr.Close()
	if o := <-out; !errors.Is(o.Err, context.Canceled) {
		t.Fatalf("turn end at close: %v", o.Err)
	}
	if err := tr.Gate(context.Background(), "s"); err != nil {
		t.Fatalf("gate after the turn end: %v", err)
	}
	if o := <-tr.Async("s", func(context.Context) (meta.TurnResult, error) {
		t.Error("turn end ran after Close")
		return meta.TurnResult{}, nil
	}); !errors.Is(o.Err, errdefs.ErrUnavailable) {
		t.Fatalf("turn end after close: %v", o.Err)
	}
}

// Commands running at once share the sandbox's recording limit: what is
// held of their output never exceeds it, so one of two that together
// print past it is cut.
func TestRecordingSharesTheLimit(t *testing.T) {
	tr := newTracker(t)
	tr.cfg.RecordLimit = func(string) int64 { return 100 << 10 }
	ts := &state{}
	tr.m["s"] = ts
	exit, _ := json.Marshal(v1.ExitStatus{})
	var conns []net.Conn
	for i := 0; i < 2; i++ {
		a, b := net.Pipe()
		rc := tr.Recording("s", a, meta.TurnCommand{Args: []string{"yes"}})
		conns = append(conns, rc)
		go func() {
			b.Write(frame(v1.FrameStdout, []byte(strings.Repeat("y", 80<<10))))
			b.Write(frame(v1.FrameExit, exit))
			b.Close()
		}()
		if _, err := io.Copy(io.Discard, rc); err != nil {
			t.Fatal(err)
		}
	}
	if u := tr.usage["s"]; u > 100<<10 {
		t.Fatalf("%d bytes counted, over the limit", u)
	}
	for _, c := range conns {
		c.Close()
	}
	if len(ts.commands) != 2 || ts.commands[0].Cut || !ts.commands[1].Cut || len(ts.commands[1].Stdout) != keepOutput {
		t.Fatalf("commands: cut %v/%v, kept %d/%d bytes", ts.commands[0].Cut, ts.commands[1].Cut, len(ts.commands[0].Stdout), len(ts.commands[1].Stdout))
	}
}
