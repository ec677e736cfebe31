package meta

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Meta is the bucket of the store's own keys; schemaKey holds the
// schema version, in decimal.
// rebuildKey marks a database that was empty when opened until the
// caller has rebuilt its records (Tx.Rebuilt), so that a crash during
// the rebuild leaves it to the next start.
const (
	Meta       = "meta"
	schemaKey  = "schema"
	rebuildKey = "rebuild"
)

// A migration brings the database from schema-1 to schema, inside the
// transaction that records the new version. As in containerd's
// core/metadata/migrations.go, migrations are only ever appended: a
// database of any older schema runs those after its own, in order.
type migration struct {
	schema  int
	what    string
	migrate func(*bolt.Tx) error
}

// migrations, in order. Schema 0 is a database from before the version
// was kept (or an empty file).
var migrations = []migration{
	{1, "the record buckets", func(tx *bolt.Tx) error {
		for _, b := range []string{Images, Sandboxes, Checkpoints, Turns, Takeovers} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	}},
	{2, "the failed checkpoints bucket", func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte(FailedCheckpoints))
		return err
	}},
	{3, "the tenants and tokens buckets", func(tx *bolt.Tx) error {
		for _, b := range []string{Tenants, Tokens} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	}},
}

// SchemaVersion is the schema this build reads and writes.
var SchemaVersion = migrations[len(migrations)-1].schema

// recordBuckets hold JSON records (check decodes every one).
var recordBuckets = []string{Images, Sandboxes, Checkpoints, Turns, Takeovers, FailedCheckpoints, Tenants, Tokens}

// schemaOf returns the database's schema version (0 if none is kept).
func schemaOf(tx *bolt.Tx) (int, error) {
	b := tx.Bucket([]byte(Meta))
	if b == nil {
		return 0, nil
	}
	v := b.Get([]byte(schemaKey))
	if v == nil {
		return 0, nil
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("schema version %q: %w", v, ErrCorrupt)
	}
	return n, nil
}

// migrate brings the database to SchemaVersion, refusing a newer one
// before it writes anything.
func (d *DB) migrate() error {
	return d.db.Update(func(tx *bolt.Tx) error {
		v, err := schemaOf(tx)
		if err != nil {
			return err
		}
		if v > SchemaVersion {
			return fmt.Errorf("metadata schema %d is newer than this molt's (%d): it was written by a newer molt; run that one (a database is never downgraded): %w", v, SchemaVersion, errdefs.ErrFailedPrecondition)
		}
		empty := true
		if err := tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil }); err != nil {
			return err
		}
		if meta := tx.Bucket([]byte(Meta)); meta != nil && meta.Get([]byte(rebuildKey)) != nil {
			d.fresh = true
		}
		if v == SchemaVersion {
			return nil
		}
		for _, m := range migrations {
			if m.schema <= v {
				continue
			}
			if err := m.migrate(tx); err != nil {
				return fmt.Errorf("migrate to schema %d (%s): %w", m.schema, m.what, err)
			}
		}
		meta, err := tx.CreateBucketIfNotExists([]byte(Meta))
		if err != nil {
			return err
		}
		if empty {
			d.fresh = true
			if err := meta.Put([]byte(rebuildKey), []byte("1")); err != nil {
				return err
			}
		}
		return meta.Put([]byte(schemaKey), []byte(strconv.Itoa(SchemaVersion)))
	})
}

// Rebuilt ends the rebuild of a database that was empty when opened
// (Fresh): it commits with the rebuilt records.
func (t *Tx) Rebuilt() error {
	t.rebuilt = true
	return t.tx.Bucket([]byte(Meta)).Delete([]byte(rebuildKey))
}

// SetSchema records schema version v (for tests of the refusal).
func (d *DB) SetSchema(v int) error {
	return d.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists([]byte(Meta))
		if err != nil {
			return err
		}
		return meta.Put([]byte(schemaKey), []byte(strconv.Itoa(v)))
	})
}

// check reads the whole database: bbolt's page check, and every record
// of the record buckets must decode. A page beyond the end of a
// truncated file faults when read: the fault is turned into an error.
func (d *DB) check() (err error) {
	done := make(chan error, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("reading the database faulted: %v", r)
			}
		}()
		done <- d.db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				return err
			}
			for _, name := range recordBuckets {
				b := tx.Bucket([]byte(name))
				if b == nil {
					continue
				}
				err := b.ForEach(func(k, v []byte) error {
					if !json.Valid(v) {
						return fmt.Errorf("%s %q does not decode", name, k)
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
	}()
	return <-done
}

// probeLock fails with errdefs.ErrUnavailable if another process holds
// the database (bbolt's flock), waiting up to two seconds.
func probeLock(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return unix.Flock(int(f.Fd()), unix.LOCK_UN)
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("locked by another process (is a molt daemon already running on this root?): %w", errdefs.ErrUnavailable)
		}
	}
}

// boltOpen opens the database; bbolt panics on some damaged files (a
// freelist page that is not one), and faults on pages past the end of
// the file: both are reported as ErrCorrupt.
func boltOpen(path string) (db *bolt.DB, err error) {
	type result struct {
		db  *bolt.DB
		err error
	}
	done := make(chan result, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				done <- result{nil, fmt.Errorf("%w: bbolt: %v", ErrCorrupt, r)}
			}
		}()
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
		done <- result{db, err}
	}()
	r := <-done
	return r.db, r.err
}

// checkFile refuses a file shorter than its meta pages say the database
// is (a truncated file, which bbolt would map and fault on). A missing
// or empty file is a new database; a file whose meta pages are both
// invalid is left to bbolt to refuse.
func checkFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return err
	}
	// Page header (16 bytes), then the meta: magic, version, page size,
	// flags (4 bytes each), root bucket (16), freelist page (8), high
	// water page (8), txid (8): 56 bytes, then their FNV-64a.
	const hdr, metaLen = 16, 56
	var best struct {
		txid, pgid uint64
		pageSize   uint32
		ok         bool
	}
	buf := make([]byte, hdr+metaLen+8)
	for _, off := range []int64{0, -1} {
		if off < 0 {
			if !best.ok {
				// The second meta page is one page in; without a valid
				// first one its size is a guess: bbolt decides.
				sz := int64(os.Getpagesize())
				off = sz
			} else {
				off = int64(best.pageSize)
			}
		}
		if _, err := f.ReadAt(buf, off); err != nil {
			if errors.Is(err, io.EOF) {
				continue
			}
			return err
		}
		meta := buf[hdr:]
		if binary.LittleEndian.Uint32(meta[0:]) != 0xED0CDAED {
			continue
		}
		h := fnv.New64a()
		h.Write(meta[:metaLen])
		if h.Sum64() != binary.LittleEndian.Uint64(meta[metaLen:]) {
			continue
		}
		txid := binary.LittleEndian.Uint64(meta[48:])
		if !best.ok || txid > best.txid {
			best.ok, best.txid = true, txid
			best.pageSize = binary.LittleEndian.Uint32(meta[8:])
			best.pgid = binary.LittleEndian.Uint64(meta[40:])
		}
	}
	if !best.ok {
		if fi.Size() < int64(hdr+metaLen+8) {
			return fmt.Errorf("%d bytes, not a database", fi.Size())
		}
		return nil
	}
	if want := int64(best.pgid) * int64(best.pageSize); fi.Size() < want {
		return fmt.Errorf("%d bytes, but its pages reach %d (truncated)", fi.Size(), want)
	}
	return nil
}
