package meta_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/testutil"
)

// The golden records of testdata/golden were written by the build before
// the record types got their own JSON names (when they embedded the
// api/v1 types), through the database, for each bucket: "full" with
// every field set by fill, "zero" with none. They are the database's
// format: a change that reads or writes them differently changes the
// format, and needs a migration (migrations.go), not a new golden file.

type goldenCase struct {
	bucket string
	// roundTrip puts the raw record, reads it as the bucket's type, puts
	// that back and returns what was stored.
	roundTrip func(t *testing.T, db *meta.DB, raw []byte) []byte
	// filled is the bucket's type with every field set by fill.
	filled func() any
}

func typed[T any](bucket string) goldenCase {
	b := meta.Bucket[T](bucket)
	return goldenCase{
		bucket: bucket,
		roundTrip: func(t *testing.T, db *meta.DB, raw []byte) []byte {
			t.Helper()
			if err := db.Update(func(tx *meta.Tx) error { return tx.PutRaw(bucket, "k", raw) }); err != nil {
				t.Fatal(err)
			}
			v, err := b.Get(db, "k")
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Put(db, "k2", v); err != nil {
				t.Fatal(err)
			}
			var out []byte
			if err := db.ForEachPrefix(bucket, "k2", func(_ string, b []byte) error { out = bytes.Clone(b); return nil }); err != nil {
				t.Fatal(err)
			}
			return out
		},
		filled: func() any {
			var v T
			n := 0
			testutil.Fill(reflect.ValueOf(&v).Elem(), "x", &n)
			return v
		},
	}
}

var goldenCases = []goldenCase{
	typed[meta.Image](meta.Images),
	typed[meta.SandboxRecord](meta.Sandboxes),
	typed[meta.CheckpointRecord](meta.Checkpoints),
	typed[meta.CheckpointRecord](meta.FailedCheckpoints),
	typed[meta.TurnRecord](meta.Turns),
	typed[hot.Record](meta.Takeovers),
}

// TestGoldenRecords: the records of the earlier build read into the
// record types and are written back byte for byte, for each bucket.
func TestGoldenRecords(t *testing.T) {
	db, err := meta.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range goldenCases {
		for _, which := range []string{"full", "zero"} {
			raw, err := os.ReadFile(filepath.Join("testdata", "golden", c.bucket+"."+which+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.roundTrip(t, db, raw); !bytes.Equal(got, raw) {
				t.Errorf("%s %s: written back as\n%s\nwant\n%s", c.bucket, which, got, raw)
			}
		}
	}
}

// TestGoldenFields: a record type with every field set encodes as the
// full golden record, so a field added, renamed or moved in a record
// type fails here (and a golden record cannot miss a field).
func TestGoldenFields(t *testing.T) {
	for _, c := range goldenCases {
		raw, err := os.ReadFile(filepath.Join("testdata", "golden", c.bucket+".full.json"))
		if err != nil {
			t.Fatal(err)
		}
		db, err := meta.Open(filepath.Join(t.TempDir(), c.bucket))
		if err != nil {
			t.Fatal(err)
		}
		err = db.Put(c.bucket, "k", c.filled())
		var got []byte
		if err == nil {
			err = db.ForEachPrefix(c.bucket, "k", func(_ string, b []byte) error { got = bytes.Clone(b); return nil })
		}
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		if os.Getenv("MOLT_UPDATE_GOLDEN") == "1" {
			// A field was added on purpose: write the new full record
			// (review its diff; the zero record must not change).
			if err := os.WriteFile(filepath.Join("testdata", "golden", c.bucket+".full.json"), got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !bytes.Equal(got, raw) {
			t.Errorf("%s: every field set encodes as\n%s\nwant\n%s (MOLT_UPDATE_GOLDEN=1 rewrites it)", c.bucket, got, raw)
		}
	}
}
