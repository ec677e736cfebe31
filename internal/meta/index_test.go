package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
)

type ckRec struct {
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	Label   string `json:"label,omitempty"`
}

// bySandbox indexes checkpoints by their sandbox, and by "label:L" for a
// label, as a caller would.
func bySandbox(raw []byte) ([]string, error) {
	var c ckRec
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	v := []string{c.Sandbox}
	if c.Label != "" {
		v = append(v, "label:"+c.Label)
	}
	return v, nil
}

func ids(t *testing.T, d *DB, ix *Index, value string) []string {
	t.Helper()
	recs, err := ListBy[ckRec](d, ix, value)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	keys, err := ix.Keys(d, value)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, out) && !(len(keys) == 0 && len(out) == 0) {
		t.Fatalf("Keys %v, ListBy %v", keys, out)
	}
	return out
}

// The index follows every way a record changes: put, update (the old
// value's entry goes), delete, delete by prefix, and a rebuild's raw put.
func TestIndexFollowsRecords(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ix, err := d.AddIndex(Checkpoints, "sandbox", 1, bySandbox)
	if err != nil {
		t.Fatal(err)
	}
	put := func(c ckRec) {
		t.Helper()
		if err := d.Put(Checkpoints, c.ID, c); err != nil {
			t.Fatal(err)
		}
	}
	put(ckRec{ID: "c1", Sandbox: "a", Label: "x"})
	put(ckRec{ID: "c2", Sandbox: "a"})
	put(ckRec{ID: "c3", Sandbox: "b", Label: "x"})
	// "a" must not match "ab"'s entries: values end at a separator.
	put(ckRec{ID: "c4", Sandbox: "ab"})
	if got := ids(t, d, ix, "a"); !slices.Equal(got, []string{"c1", "c2"}) {
		t.Fatalf("sandbox a: %v", got)
	}
	if got := ids(t, d, ix, "label:x"); !slices.Equal(got, []string{"c1", "c3"}) {
		t.Fatalf("label x: %v", got)
	}
	put(ckRec{ID: "c1", Sandbox: "b"}) // moved, label dropped
	if got := ids(t, d, ix, "a"); !slices.Equal(got, []string{"c2"}) {
		t.Fatalf("sandbox a after the update: %v", got)
	}
	if got := ids(t, d, ix, "label:x"); !slices.Equal(got, []string{"c3"}) {
		t.Fatalf("label x after the update: %v", got)
	}
	if err := d.Delete(Checkpoints, "c3"); err != nil {
		t.Fatal(err)
	}
	if got := ids(t, d, ix, "b"); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("sandbox b after the delete: %v", got)
	}
	if err := d.DeletePrefix(Checkpoints, "c"); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "ab", "b", "label:x"} {
		if got := ids(t, d, ix, v); len(got) != 0 {
			t.Fatalf("%s after deleting every record: %v", v, got)
		}
	}
	err = d.Update(func(tx *Tx) error {
		return tx.PutRaw(Checkpoints, "c5", []byte(`{"id":"c5","sandbox":"a"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(t, d, ix, "a"); !slices.Equal(got, []string{"c5"}) {
		t.Fatalf("sandbox a after a raw put: %v", got)
	}
}

// An index added over existing records is built from them; it survives a
// reopen as it was, and a new version rebuilds it.
func TestIndexBuiltAndRebuilt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "molt.db")
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		c := ckRec{ID: fmt.Sprintf("c%02d", i), Sandbox: fmt.Sprintf("s%d", i%3)}
		if err := d.Put(Checkpoints, c.ID, c); err != nil {
			t.Fatal(err)
		}
	}
	ix, err := d.AddIndex(Checkpoints, "sandbox", 1, bySandbox)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(t, d, ix, "s1"); !slices.Equal(got, []string{"c01", "c04", "c07"}) {
		t.Fatalf("s1: %v", got)
	}
	d.Close()
	d, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The same version is not rebuilt: a values function that would
	// index differently shows it.
	calls := 0
	ix, err = d.AddIndex(Checkpoints, "sandbox", 1, func(raw []byte) ([]string, error) {
		calls++
		return bySandbox(raw)
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 0 {
		t.Fatalf("an unchanged index was rebuilt (%d records read)", calls)
	}
	if got := ids(t, d, ix, "s2"); !slices.Equal(got, []string{"c02", "c05", "c08"}) {
		t.Fatalf("s2 after reopening: %v", got)
	}
	ix, err = d.AddIndex(Checkpoints, "sandbox", 2, func(raw []byte) ([]string, error) {
		v, err := bySandbox(raw)
		return []string{"v2-" + v[0]}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(t, d, ix, "s2"); len(got) != 0 {
		t.Fatalf("old values after a new version: %v", got)
	}
	if got := ids(t, d, ix, "v2-s2"); !slices.Equal(got, []string{"c02", "c05", "c08"}) {
		t.Fatalf("v2-s2: %v", got)
	}
}

// A record whose values cannot be computed is not stored: the index and
// the records never disagree.
func TestIndexRefusesWhatItCannotIndex(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ix, err := d.AddIndex(Checkpoints, "sandbox", 1, bySandbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(Checkpoints, "c1", ckRec{ID: "c1", Sandbox: "a\x00b"}); err == nil {
		t.Fatal("a value holding NUL was indexed")
	}
	bad := errors.New("bad")
	ix2, err := d.AddIndex(Sandboxes, "fail", 1, func([]byte) ([]string, error) { return nil, bad })
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(Sandboxes, "s1", ckRec{ID: "s1"}); !errors.Is(err, bad) {
		t.Fatalf("put with a failing index: %v", err)
	}
	var c ckRec
	if err := d.Get(Sandboxes, "s1", &c); err == nil {
		t.Fatal("a record that could not be indexed was stored")
	}
	if got := ids(t, d, ix, "a\x00b"); len(got) != 0 {
		t.Fatalf("entries of a refused record: %v", got)
	}
	_ = ix2
}

func TestTypedBucket(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cks := Bucket[ckRec](Checkpoints)
	ix, err := d.AddIndex(Checkpoints, "sandbox", 1, bySandbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := cks.Put(d, "c1", ckRec{ID: "c1", Sandbox: "a"}); err != nil {
		t.Fatal(err)
	}
	c, err := cks.Get(d, "c1")
	if err != nil || c.Sandbox != "a" {
		t.Fatalf("get: %+v, %v", c, err)
	}
	if l, err := cks.ListBy(d, ix, "a"); err != nil || len(l) != 1 || l[0].ID != "c1" {
		t.Fatalf("list by: %+v, %v", l, err)
	}
	if err := cks.Delete(d, "c1"); err != nil {
		t.Fatal(err)
	}
	if l, err := cks.List(d); err != nil || len(l) != 0 {
		t.Fatalf("list after delete: %+v, %v", l, err)
	}
}
