package meta

import (
	"bytes"
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
)

// An Index finds the records of a bucket by a value computed from each
// (a checkpoint's sandbox, a sandbox's name) without reading the others.
//
// Its entries live in a bucket of their own, written in the same
// transaction as the record they index, so the index is never behind the
// records, whatever crash comes between. The store still knows nothing
// about what records mean: the caller gives the function that computes a
// record's values, and a version it raises when that function changes,
// which makes the next AddIndex rebuild the entries from the records.
type Index struct {
	name   string // the entries' bucket
	bucket string // the records'
	values func(raw []byte) ([]string, error)
}

// indexSep ends a value in an entry's key (value, indexSep, record key):
// values with NUL in them are refused, so one value's entries are
// exactly the keys with its prefix.
const indexSep = 0

// AddIndex declares the index name over bucket, whose entries for a
// record are values(its encoding). It is called after Open and before
// the database is shared. Entries are built from the records when the
// index is new or its version changed (indexes are derived: rebuilding
// one loses nothing).
func (d *DB) AddIndex(bucket, name string, version int, values func(raw []byte) ([]string, error)) (*Index, error) {
	ix := &Index{name: "index." + bucket + "." + name, bucket: bucket, values: values}
	err := d.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists([]byte(Meta))
		if err != nil {
			return err
		}
		vkey := []byte(ix.name)
		want := strconv.Itoa(version)
		if b := tx.Bucket([]byte(ix.name)); b != nil && string(meta.Get(vkey)) == want {
			return nil
		}
		if tx.Bucket([]byte(ix.name)) != nil {
			if err := tx.DeleteBucket([]byte(ix.name)); err != nil {
				return err
			}
		}
		ib, err := tx.CreateBucket([]byte(ix.name))
		if err != nil {
			return err
		}
		rb := tx.Bucket([]byte(bucket))
		if rb == nil {
			return fmt.Errorf("index %s: no bucket %q", name, bucket)
		}
		if err := rb.ForEach(func(k, raw []byte) error {
			return ix.add(ib, k, raw)
		}); err != nil {
			return err
		}
		return meta.Put(vkey, []byte(want))
	})
	if err != nil {
		return nil, fmt.Errorf("index %s of %s: %w", name, bucket, err)
	}
	if d.indexes == nil {
		d.indexes = map[string][]*Index{}
	}
	d.indexes[bucket] = append(d.indexes[bucket], ix)
	return ix, nil
}

func entryKey(value string, key []byte) []byte {
	e := make([]byte, 0, len(value)+1+len(key))
	e = append(e, value...)
	e = append(e, indexSep)
	return append(e, key...)
}

// add writes the entries of the record key, raw.
func (ix *Index) add(ib *bolt.Bucket, key, raw []byte) error {
	vals, err := ix.values(raw)
	if err != nil {
		return fmt.Errorf("%s %q: %w", ix.bucket, key, err)
	}
	for _, v := range vals {
		if bytes.IndexByte([]byte(v), indexSep) >= 0 {
			return fmt.Errorf("%s %q: index value %q holds NUL", ix.bucket, key, v)
		}
		if err := ib.Put(entryKey(v, key), nil); err != nil {
			return err
		}
	}
	return nil
}

// remove deletes the entries of the record key, raw (its encoding as
// stored).
func (ix *Index) remove(ib *bolt.Bucket, key, raw []byte) error {
	vals, err := ix.values(raw)
	if err != nil {
		// A record that was stored was indexed: its values decoded
		// then, and decode now.
		return fmt.Errorf("%s %q: %w", ix.bucket, key, err)
	}
	for _, v := range vals {
		if err := ib.Delete(entryKey(v, key)); err != nil {
			return err
		}
	}
	return nil
}

// reindex updates the indexes of bucket for the record key going from
// old to new (either nil: created or deleted), inside tx.
func (t *Tx) reindex(bucket string, key, old, new []byte) error {
	if t.d == nil {
		return nil
	}
	for _, ix := range t.d.indexes[bucket] {
		ib := t.tx.Bucket([]byte(ix.name))
		if old != nil {
			if err := ix.remove(ib, key, old); err != nil {
				return err
			}
		}
		if new != nil {
			if err := ix.add(ib, key, new); err != nil {
				return err
			}
		}
	}
	return nil
}

// Keys returns the keys of the records whose values include value, in
// key order.
func (ix *Index) Keys(d *DB, value string) ([]string, error) {
	var out []string
	err := d.db.View(func(tx *bolt.Tx) error {
		out = ix.keys(tx, value)
		return nil
	})
	return out, err
}

func (ix *Index) keys(tx *bolt.Tx, value string) []string {
	var out []string
	p := entryKey(value, nil)
	c := tx.Bucket([]byte(ix.name)).Cursor()
	for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
		out = append(out, string(k[len(p):]))
	}
	return out
}

// ListBy returns the records of ix's bucket whose values include value,
// in key order, each decoded into a fresh T, read in one transaction.
func ListBy[T any](d *DB, ix *Index, value string) ([]T, error) {
	var out []T
	err := d.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(ix.bucket))
		for _, k := range ix.keys(tx, value) {
			raw := b.Get([]byte(k))
			if raw == nil {
				return fmt.Errorf("index %s: entry %q names no record: %w", ix.name, k, ErrCorrupt)
			}
			var v T
			if err := Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("%s %q: %w", ix.bucket, k, err)
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}
