package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
)

// counterWriter appends 1, 2, 3, ... to /c, one line a millisecond,
// flushed each time; on SIGUSR1 it writes its in-memory counter to /mem
// between two appends, when /c ends with it.
const counterWriter = `
import os, signal, time
i = 0
ask = False
def on_usr1(*_):
    global ask
    ask = True
signal.signal(signal.SIGUSR1, on_usr1)
f = open("/c", "a")
while True:
    i += 1
    f.write("%d\n" % i)
    f.flush()
    if ask:
        ask = False
        with open("/mem.tmp", "w") as m:
            m.write("%d\n" % i)
        os.rename("/mem.tmp", "/mem")
    time.sleep(0.001)
`

// lastCount is the last complete line of a counter file, 0 if none.
func lastCount(b []byte) int {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	n, _ := strconv.Atoi(lines[len(lines)-1])
	return n
}

// TestHibernateLosesNoWrite runs a writer through a hibernation: the
// host reads the writer's file during Hibernate, and every count it saw
// there must survive the resume (no write the world saw after the
// captured instant is lost), and the resumed writer's in-memory counter
// must be where its file ends (files and processes of one instant). It
// then checks that the checkpoint a hibernated sandbox is hibernated at
// cannot be deleted.
func TestHibernateLosesNoWrite(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	if err := os.WriteFile(filepath.Join(m.sbRoot(sb.ID), "w.py"), []byte(counterWriter), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "python3 /w.py >/dev/null 2>&1 &")
	file := func() []byte {
		b, _ := os.ReadFile(filepath.Join(m.sbRoot(sb.ID), "c"))
		return b
	}
	for deadline := time.Now().Add(10 * time.Second); lastCount(file()) < 50; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the writer did not start")
		}
	}
	// What the host sees of the file while Hibernate runs.
	var seen atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if n := int64(lastCount(file())); n > seen.Load() {
				seen.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	hib, err := m.Hibernate(ctx, sb.ID)
	close(stop)
	<-watched
	if err != nil {
		t.Fatal(err)
	}
	if hib.State != v1.StateHibernated {
		t.Fatalf("state %s after hibernate", hib.State)
	}

	// The checkpoint it is hibernated at cannot go.
	err = m.DeleteCheckpoint(ctx, hib.Head)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("deleting the hibernated sandbox's checkpoint: %v, want failed precondition", err)
	}
	if _, err := m.CheckpointInfo(hib.Head); err != nil {
		t.Fatalf("the checkpoint is gone after the refused delete: %v", err)
	}

	if _, err := m.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	after := lastCount(file())
	if int64(after) < seen.Load() {
		t.Fatalf("the host saw count %d in the file during hibernate; after resume the file ends at %d: writes after the captured instant were lost", seen.Load(), after)
	}
	// The resumed writer's counter is its file's: ask it, then look.
	run(t, m, sb.ID, "pkill -USR1 -f /w.py")
	var mem int
	for deadline := time.Now().Add(10 * time.Second); mem == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the resumed writer did not answer")
		}
		b, _ := os.ReadFile(filepath.Join(m.sbRoot(sb.ID), "mem"))
		mem, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	b := file()
	var lines []int
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		n, err := strconv.Atoi(l)
		if err != nil {
			t.Fatalf("line %q in the counter file", l)
		}
		lines = append(lines, n)
	}
	// Every count once, in order: nothing lost, nothing doubled.
	for i, n := range lines {
		if n != i+1 {
			t.Fatalf("line %d of the counter file is %d", i+1, n)
		}
	}
	if mem > len(lines) || mem <= after {
		t.Fatalf("the writer's counter %d, its file ends at %d (at resume %d)", mem, len(lines), after)
	}
	t.Logf("host saw up to %d during hibernate; the file ended at %d at resume", seen.Load(), after)
	// Once running again, it goes.
	if err := m.DeleteCheckpoint(ctx, hib.Head); err != nil {
		t.Fatalf("delete after resume: %v", err)
	}
}
