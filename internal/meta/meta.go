// Package meta keeps molt's metadata in an embedded bbolt database.
//
// Records are JSON documents in one bucket per kind, keyed by ID. Each
// Put is one bbolt transaction, fsynced before it returns, so a record
// that was reported written survives a crash of the daemon. The store
// knows nothing about what the records mean: invariants between records
// (a checkpoint's sandbox exists, a name is unique) are kept by the
// caller, under its own locks.
//
// The database carries a schema version (bucket meta, key schema) and
// is brought to the current one by the migrations of migrations.go, in
// order, when it is opened; a database of a newer schema is refused. A
// file that bbolt cannot open, or whose records do not decode, is
// reported as ErrCorrupt; OpenRecords sets it aside and opens a new one
// (the store never deletes a database). KeepCopies keeps a copy of each
// image, sandbox and checkpoint record next to what it describes in the
// pool (copies.go), from which Rebuild refills a database that was
// lost, emptied or set aside (rebuild.go); the engine tells meta where
// the copies live and what the pool holds (Disk).
//
// Bucket[T] types a bucket's records. AddIndex declares an index over a
// bucket (index.go): lookups by a record's value (the checkpoints of a
// sandbox) read only the records that have it, and the entries are
// written in the transaction that writes the record.
package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/molt-sh/molt/internal/errdefs"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Buckets.
const (
	Images      = "images"
	Sandboxes   = "sandboxes"
	Checkpoints = "checkpoints"
	// Turns holds each sandbox's turn log, keyed "<sandbox>/<turn>".
	Turns = "turns"
	// Takeovers holds the switches of a sandbox's live tree that may
	// be under way, keyed "<sandbox>/<name>".
	Takeovers = "takeovers"
	// FailedCheckpoints holds the checkpoints that were reported pending
	// and never committed, with the reason, keyed "<sandbox>/<id>".
	FailedCheckpoints = "failed_checkpoints"
	// Tenants holds the host's tenants by name; Tokens their API tokens
	// by ID (internal/tenant).
	Tenants = "tenants"
	Tokens  = "tokens"
)

// DB is an open metadata database.
type DB struct {
	db    *bolt.DB
	fresh bool // see Fresh; written by Open and the rebuild's Update
	// watch holds the functions of Watch, by bucket; set before the
	// database is shared.
	watch map[string]func(txid uint64, key string, b []byte)
	// indexes holds the indexes of each bucket (AddIndex); set before
	// the database is shared.
	indexes map[string][]*Index
}

// ErrCorrupt says a database file cannot be read as one: bbolt refuses
// it, its pages do not check, or a record does not decode.
var ErrCorrupt = errors.New("metadata database is corrupt")

// Open opens (creating if needed) the database at path and migrates it
// to SchemaVersion. It fails fast if another process holds it, with
// errdefs.ErrFailedPrecondition on a newer schema and with ErrCorrupt on
// a file that does not read as a database.
func Open(path string) (*DB, error) {
	// Another daemon's database is neither read nor judged here: a
	// corrupt one is set aside by the caller.
	if err := probeLock(path); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := checkFile(path); err != nil {
		return nil, fmt.Errorf("open %s: %w: %w", path, ErrCorrupt, err)
	}
	db, err := boltOpen(path)
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: locked by another process (is a molt daemon already running on this root?): %w", path, errdefs.ErrUnavailable)
		}
		if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) || errors.Is(err, berrors.ErrInvalidMapping) {
			return nil, fmt.Errorf("open %s: %w: %w", path, ErrCorrupt, err)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	d := &DB{db: db}
	if err := d.check(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w: %w", path, ErrCorrupt, err)
	}
	if err := d.migrate(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return d, nil
}

// Fresh reports whether the database held nothing when it was opened
// (a new or emptied file), or was, and the rebuild that followed did not
// commit (Tx.Rebuilt): what the caller recorded before is then only on
// disk, and it rebuilds the records from there.
func (d *DB) Fresh() bool { return d.fresh }

// Watch makes fn be called after each committed transaction, once for
// every record of bucket the transaction put (b, its encoding) or
// deleted (b nil), in the transaction's order. txid grows with each
// transaction, so a caller that writes copies from concurrent
// transactions can keep the latest. Watch is called before the database
// is used.
func (d *DB) Watch(bucket string, fn func(txid uint64, key string, b []byte)) {
	if d.watch == nil {
		d.watch = map[string]func(uint64, string, []byte){}
	}
	d.watch[bucket] = fn
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }

// Put stores v under key in bucket.
func (d *DB) Put(bucket, key string, v any) error {
	return d.Update(func(tx *Tx) error { return tx.Put(bucket, key, v) })
}

// Get loads key from bucket into v; errdefs.ErrNotFound if missing.
func (d *DB) Get(bucket, key string, v any) error {
	return d.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket)).Get([]byte(key))
		if b == nil {
			return fmt.Errorf("%s %q: %w", bucket, key, errdefs.ErrNotFound)
		}
		return json.Unmarshal(b, v)
	})
}

// Delete removes key from bucket; a missing key is not an error.
func (d *DB) Delete(bucket, key string) error {
	return d.Update(func(tx *Tx) error { return tx.Delete(bucket, key) })
}

// List returns every record of bucket, in key order, each decoded into
// a fresh T.
func List[T any](d *DB, bucket string) ([]T, error) {
	var out []T
	err := d.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = list[T](tx, bucket)
		return err
	})
	return out, err
}

// ListIn is List inside the transaction tx.
func ListIn[T any](tx *Tx, bucket string) ([]T, error) { return list[T](tx.tx, bucket) }

func list[T any](tx *bolt.Tx, bucket string) ([]T, error) {
	var out []T
	err := tx.Bucket([]byte(bucket)).ForEach(func(k, b []byte) error {
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return fmt.Errorf("%s %q: %w", bucket, k, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// ForEachPrefix calls fn with the key and raw record of every key of
// bucket that starts with prefix, in key order.
func (d *DB) ForEachPrefix(bucket, prefix string, fn func(key string, b []byte) error) error {
	return d.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket([]byte(bucket)).Cursor()
		p := []byte(prefix)
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			if err := fn(string(k), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// LastWithPrefix returns the last key of bucket (in key order) that
// starts with prefix, or "" and false: a seek, not a scan.
func (d *DB) LastWithPrefix(bucket, prefix string) (string, bool) {
	var last string
	_ = d.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket([]byte(bucket)).Cursor()
		p := []byte(prefix)
		// The first key past every key with the prefix, then back one.
		k, _ := c.Seek(append(bytes.Clone(p), 0xff))
		if k == nil {
			k, _ = c.Last()
		} else {
			k, _ = c.Prev()
		}
		if k != nil && bytes.HasPrefix(k, p) {
			last = string(k)
		}
		return nil
	})
	return last, last != ""
}

// DeletePrefix removes every key of bucket that starts with prefix.
func (d *DB) DeletePrefix(bucket, prefix string) error {
	return d.Update(func(t *Tx) error { return t.DeletePrefix(bucket, prefix) })
}

// Unmarshal decodes a raw record.
func Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// Tx is a read-write transaction: its changes commit together or not at
// all.
type Tx struct {
	tx      *bolt.Tx
	d       *DB
	changes []change // to watched buckets
	rebuilt bool
}

type change struct {
	bucket, key string
	b           []byte
}

func (t *Tx) changed(bucket, key string, b []byte) {
	if t.d != nil && t.d.watch[bucket] != nil {
		t.changes = append(t.changes, change{bucket, key, b})
	}
}

// Update runs fn in one transaction, committed (and fsynced) if fn
// returns nil; then the functions of Watch see its changes.
func (d *DB) Update(fn func(*Tx) error) error {
	var t *Tx
	var txid uint64
	err := d.db.Update(func(tx *bolt.Tx) error {
		t = &Tx{tx: tx, d: d}
		txid = uint64(tx.ID())
		return fn(t)
	})
	if err != nil || t == nil {
		return err
	}
	if t.rebuilt {
		d.fresh = false
	}
	for _, c := range t.changes {
		d.watch[c.bucket](txid, c.key, c.b)
	}
	return nil
}

// Put stores v under key in bucket.
func (t *Tx) Put(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.put(bucket, key, b)
}

// put stores the encoded record b, and its index entries.
func (t *Tx) put(bucket, key string, b []byte) error {
	bk := t.tx.Bucket([]byte(bucket))
	// The old record's bytes are the database's own: copied, so the
	// index writes cannot move them before they are read.
	if err := t.reindex(bucket, []byte(key), bytes.Clone(bk.Get([]byte(key))), b); err != nil {
		return err
	}
	if err := bk.Put([]byte(key), b); err != nil {
		return err
	}
	t.changed(bucket, key, b)
	return nil
}

// PutRaw stores the encoded record b under key in bucket.
func (t *Tx) PutRaw(bucket, key string, b []byte) error {
	if !json.Valid(b) {
		return fmt.Errorf("%s %q: not a JSON record", bucket, key)
	}
	return t.put(bucket, key, b)
}

// Get loads key from bucket into v; errdefs.ErrNotFound if missing.
func (t *Tx) Get(bucket, key string, v any) error {
	b := t.tx.Bucket([]byte(bucket)).Get([]byte(key))
	if b == nil {
		return fmt.Errorf("%s %q: %w", bucket, key, errdefs.ErrNotFound)
	}
	return json.Unmarshal(b, v)
}

// Delete removes key from bucket.
func (t *Tx) Delete(bucket, key string) error {
	bk := t.tx.Bucket([]byte(bucket))
	if old := bytes.Clone(bk.Get([]byte(key))); old != nil {
		if err := t.reindex(bucket, []byte(key), old, nil); err != nil {
			return err
		}
	}
	if err := bk.Delete([]byte(key)); err != nil {
		return err
	}
	t.changed(bucket, key, nil)
	return nil
}

// DeletePrefix removes every key of bucket that starts with prefix.
func (t *Tx) DeletePrefix(bucket, prefix string) error {
	c := t.tx.Bucket([]byte(bucket)).Cursor()
	p := []byte(prefix)
	for k, old := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, old = c.Seek(p) {
		key := string(k)
		if err := t.reindex(bucket, bytes.Clone(k), bytes.Clone(old), nil); err != nil {
			return err
		}
		if err := c.Delete(); err != nil {
			return err
		}
		t.changed(bucket, key, nil)
	}
	return nil
}
