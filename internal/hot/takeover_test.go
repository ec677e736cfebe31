package hot

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
)

var zeroInit sandbox.Init

// Records are read back by sandbox, unreadable ones dropped with the
// rest; a commit writes the sandbox's record and deletes the takeover's
// in one transaction, or neither.
func TestTakeoverRecords(t *testing.T) {
	db, err := meta.Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tk := NewTakeovers(db)
	put := func(key string, r Record) {
		if err := db.Put(meta.Takeovers, key, r); err != nil {
			t.Fatal(err)
		}
	}
	put("sb/rollback", Record{Root: "u1", Path: "/p/root.next", Head: "c1"})
	put("sb/standby-1", Record{Root: "u2", Path: "/p/standby-c2", Head: "c2", Init: sandbox.Init{Pid: 7, Start: 9}})
	put("other/rollback", Record{Root: "u3", Head: "c3", Restart: true})
	// Valid JSON, not a record (the store refuses anything else).
	if err := db.Put(meta.Takeovers, "bad/x", []int{1}); err != nil {
		t.Fatal(err)
	}
	var unreadable []string
	pending, keys, err := tk.Pending(func(key string, err error) { unreadable = append(unreadable, key) })
	if err != nil {
		t.Fatal(err)
	}
	if len(pending["sb"]) != 2 || len(pending["other"]) != 1 || len(keys) != 4 || !slices.Equal(unreadable, []string{"bad/x"}) {
		t.Fatalf("pending %v, keys %v, unreadable %v", pending, keys, unreadable)
	}
	if got := Switched(pending["sb"], "u2"); len(got) != 1 || got[0].Head != "c2" || got[0].Init.Pid != 7 {
		t.Fatalf("switched %v", got)
	}
	if got := Switched(pending["sb"], "u9"); len(got) != 0 {
		t.Fatalf("switched on another root: %v", got)
	}
	// A failed write deletes nothing.
	boom := errors.New("boom")
	if err := tk.Commit("sb/rollback", func(*meta.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	var r Record
	if err := db.Get(meta.Takeovers, "sb/rollback", &r); err != nil {
		t.Fatalf("record gone after a failed commit: %v", err)
	}
	if err := tk.Commit("sb/rollback", func(tx *meta.Tx) error { return tx.Put(meta.Sandboxes, "sb", map[string]string{"head": "c1"}) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Get(meta.Takeovers, "sb/rollback", &r); err == nil {
		t.Fatal("record kept after its commit")
	}
	if err := tk.Forget("sb/standby-1"); err != nil {
		t.Fatal(err)
	}
	if err := tk.Forget(""); err != nil {
		t.Fatal(err)
	}
	if err := tk.Clear(keys); err != nil {
		t.Fatal(err)
	}
	if pending, keys, _ := tk.Pending(func(string, error) {}); len(pending) != 0 || len(keys) != 0 {
		t.Fatalf("after Clear: %v %v", pending, keys)
	}
}
