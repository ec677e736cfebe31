package ledger

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/keys"
)

// TestExportImport: a ledger moves to another host's Ledger whole (its
// records in their latest state, its head), goes on there where it left
// off, and survives a reopen; a damaged or foreign import changes
// nothing; a sealed ledger does not leave its host.
func TestExportImport(t *testing.T) {
	src, dst := open(t, t.TempDir()), open(t, t.TempDir())
	e1 := effect(t, src, "sb", post("/a", "1"), 200)
	effect(t, src, "sb", post("/b", "2"), 201)
	if err := src.Rewind("sb", e1.ID); err != nil { // /b is an orphan now
		t.Fatal(err)
	}
	data, err := src.Export("sb")
	if err != nil || len(data) == 0 {
		t.Fatalf("export: %d bytes, %v", len(data), err)
	}
	if b, err := src.Export("nobody"); b != nil || err != nil {
		t.Fatalf("export of a sandbox without a ledger: %q, %v", b, err)
	}
	// What dst had of sb (an older copy) is replaced.
	effect(t, dst, "sb", post("/old", "0"), 200)
	if err := dst.Import("sb", data); err != nil {
		t.Fatal(err)
	}
	want, _ := src.List("sb", "")
	got, err := dst.List("sb", "")
	if err != nil || !reflect.DeepEqual(got, want) || dst.Head("sb") != e1.ID {
		t.Fatalf("imported: %+v (head %s), %v\nwant %+v (head %s)", got, dst.Head("sb"), err, want, e1.ID)
	}
	if m := dst.Match("sb", post("/b", "2")); m.Orphan == nil {
		t.Fatalf("the orphan did not move: %+v", m)
	}
	next := effect(t, dst, "sb", post("/c", "3"), 200)
	if next.Seq != 3 || next.Prev != e1.ID {
		t.Fatalf("the next record there: %+v", next)
	}

	// Refused, and nothing changed: a cut import, a damaged line, another
	// sandbox's records.
	before, _ := dst.List("sb", "")
	bad := append([]byte(nil), data...)
	bad[len(bad)/3] ^= 0x20
	for name, in := range map[string][]byte{"cut": data[:len(data)-5], "damaged": bad} {
		if err := dst.Import("sb", in); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s import: %v", name, err)
		}
	}
	if err := dst.Import("other", data); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an import under another sandbox's name: %v", err)
	}
	if after, _ := dst.List("sb", ""); !reflect.DeepEqual(after, before) {
		t.Fatalf("a refused import changed the ledger: %+v", after)
	}
	dir := dst.dir
	dst.Close()
	again := open(t, dir)
	if after, _ := again.List("sb", ""); !reflect.DeepEqual(after, before) {
		t.Fatalf("after a reopen: %+v, want %+v", after, before)
	}

	ring, err := keys.OpenRing(filepath.Join(t.TempDir(), "keys"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sealed, _ := sealedLedger(t, t.TempDir(), ring)
	defer sealed.Close()
	// Without secrets, nothing is sealed: it moves.
	effect(t, sealed, "sb", post("/a", "1"), 200)
	if b, err := sealed.Export("sb"); err != nil || len(b) == 0 {
		t.Fatalf("export of a ledger with nothing sealed: %d bytes, %v", len(b), err)
	}
	// A credential in a payload is sealed with this host's key: it stays.
	writeSecrets(t, sealed)
	if _, err := sealed.Export("sb"); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Fatalf("export of a ledger with sealed payloads: %v", err)
	}
}
