// Package store keeps molt's metadata in an embedded bbolt database.
//
// Records are JSON documents in one bucket per kind, keyed by ID. Each
// Put is one bbolt transaction, fsynced before it returns, so a record
// that was reported written survives a crash of the daemon. The store
// knows nothing about what the records mean: invariants between records
// (a checkpoint's sandbox exists, a name is unique) are kept by the
// caller, under its own locks.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
)

// DB is an open metadata database.
type DB struct{ db *bolt.DB }

// Open opens (creating if needed) the database at path. It fails fast if
// another process holds it.
func Open(path string) (*DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: locked by another process (is a molt daemon already running on this root?): %w", path, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{Images, Sandboxes, Checkpoints, Turns, Takeovers, FailedCheckpoints} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init %s: %w", path, err)
	}
	return &DB{db: db}, nil
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

// DeletePrefix removes every key of bucket that starts with prefix.
func (d *DB) DeletePrefix(bucket, prefix string) error {
	return d.Update(func(t *Tx) error { return t.DeletePrefix(bucket, prefix) })
}

// Unmarshal decodes a raw record.
func Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// Tx is a read-write transaction: its changes commit together or not at
// all.
type Tx struct{ tx *bolt.Tx }

// Update runs fn in one transaction, committed (and fsynced) if fn
// returns nil.
func (d *DB) Update(fn func(*Tx) error) error {
	return d.db.Update(func(tx *bolt.Tx) error { return fn(&Tx{tx: tx}) })
}

// Put stores v under key in bucket.
func (t *Tx) Put(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.tx.Bucket([]byte(bucket)).Put([]byte(key), b)
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
	return t.tx.Bucket([]byte(bucket)).Delete([]byte(key))
}

// DeletePrefix removes every key of bucket that starts with prefix.
func (t *Tx) DeletePrefix(bucket, prefix string) error {
	c := t.tx.Bucket([]byte(bucket)).Cursor()
	p := []byte(prefix)
	for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Seek(p) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}
