package meta

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/errdefs"
	bolt "go.etcd.io/bbolt"
)

type rec struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

// filled returns the path of a closed database holding n records.
func filled(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "molt.db")
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Fresh() {
		t.Fatal("a new database is not fresh")
	}
	err = d.Update(func(tx *Tx) error {
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("%012d", i)
			// Big enough records that the file spans many pages.
			if err := tx.Put(Sandboxes, id, rec{ID: id + strings.Repeat("x", 2000), N: i}); err != nil {
				return err
			}
		}
		return tx.Rebuilt()
	})
	if err != nil {
		t.Fatal(err)
	}
	if d.Fresh() {
		t.Fatal("fresh after the rebuild committed")
	}
	d.Close()
	return path
}

func TestReopenKeepsRecords(t *testing.T) {
	path := filled(t, 50)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Fresh() {
		t.Fatal("a rebuilt database is fresh again")
	}
	l, err := List[rec](d, Sandboxes)
	if err != nil || len(l) != 50 {
		t.Fatalf("%d records, %v", len(l), err)
	}
}

// TestFreshUntilRebuilt: a database opened empty stays fresh until the
// rebuild commits.
func TestFreshUntilRebuilt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "molt.db")
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if d, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !d.Fresh() {
		t.Fatal("a database whose rebuild never committed is not fresh")
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := filled(t, 1)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetSchema(SchemaVersion + 1); err != nil {
		t.Fatal(err)
	}
	d.Close()
	_, err = Open(path)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open of a newer schema: %v", err)
	}
	if errors.Is(err, ErrCorrupt) {
		t.Fatalf("a newer schema reported corrupt (it would be set aside): %v", err)
	}
}

// TestUnversionedMigrated: a database from before the schema version
// was kept (its buckets, no meta) keeps its records and gets the
// version.
func TestUnversionedMigrated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "molt.db")
	b, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Update(func(tx *bolt.Tx) error {
		for _, n := range []string{Images, Sandboxes, Checkpoints, Turns, Takeovers} {
			if _, err := tx.CreateBucket([]byte(n)); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte(Sandboxes)).Put([]byte("a"), []byte(`{"id":"a"}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Fresh() {
		t.Fatal("an unversioned database with records is fresh")
	}
	var r rec
	if err := d.Get(Sandboxes, "a", &r); err != nil || r.ID != "a" {
		t.Fatalf("record after migration: %+v %v", r, err)
	}
	err = d.db.View(func(tx *bolt.Tx) error {
		v, err := schemaOf(tx)
		if err == nil && v != SchemaVersion {
			err = fmt.Errorf("schema %d after migration, want %d", v, SchemaVersion)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCorruptRefused(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"truncated", func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			if err := os.Truncate(path, fi.Size()/3); err != nil {
				t.Fatal(err)
			}
		}},
		{"garbage", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(strings.Repeat("molt", 8192)), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"record", func(t *testing.T, path string) {
			b, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = b.Update(func(tx *bolt.Tx) error {
				return tx.Bucket([]byte(Checkpoints)).Put([]byte("x"), []byte(`{"id":`))
			})
			b.Close()
			if err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filled(t, 200)
			c.damage(t, path)
			d, err := Open(path)
			if err == nil {
				d.Close()
				t.Fatal("a damaged database opened")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestWatch: the watcher sees committed puts and deletes, with growing
// transaction IDs, and nothing of a transaction that failed.
func TestWatch(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var seen []string
	var last uint64
	d.Watch(Sandboxes, func(txid uint64, key string, b []byte) {
		if txid < last {
			t.Errorf("txid %d after %d", txid, last)
		}
		last = txid
		seen = append(seen, fmt.Sprintf("%s=%s", key, b))
	})
	if err := d.Put(Sandboxes, "a", rec{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(Images, "i", rec{ID: "i"}); err != nil {
		t.Fatal(err)
	}
	_ = d.Update(func(tx *Tx) error {
		_ = tx.Put(Sandboxes, "b", rec{ID: "b"})
		return errors.New("abandoned")
	})
	if err := d.Put(Sandboxes, "a/1", rec{ID: "c"}); err != nil {
		t.Fatal(err)
	}
	if err := d.DeletePrefix(Sandboxes, "a"); err != nil {
		t.Fatal(err)
	}
	want := `a={"id":"a","n":0} a/1={"id":"c","n":0} a= a/1=`
	if got := strings.Join(seen, " "); got != want {
		t.Fatalf("watched %s, want %s", got, want)
	}
}

// TestHeldByAnotherNotJudged: a database another process holds is
// reported unavailable, never corrupt (which would set it aside), even
// when its file looks damaged.
func TestHeldByAnotherNotJudged(t *testing.T) {
	path := filled(t, 10)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The holder's file as a reader would find it mid-damage.
	if err := os.Truncate(path, 8192); err != nil {
		t.Fatal(err)
	}
	_, err = Open(path)
	if !errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("open of a held database: %v, want unavailable", err)
	}
}
