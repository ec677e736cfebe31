package meta

// A Bucket names a bucket whose records are of type T, so that a record
// is written and read as the one type (a checkpoint's record cannot be put
// where sandboxes are kept).
type Bucket[T any] string

// Get loads key; errdefs.ErrNotFound if missing.
func (b Bucket[T]) Get(d *DB, key string) (T, error) {
	var v T
	err := d.Get(string(b), key, &v)
	return v, err
}

// Put stores v under key.
func (b Bucket[T]) Put(d *DB, key string, v T) error { return d.Put(string(b), key, v) }

// PutIn stores v under key inside the transaction tx.
func (b Bucket[T]) PutIn(tx *Tx, key string, v T) error { return tx.Put(string(b), key, v) }

// Delete removes key; a missing key is not an error.
func (b Bucket[T]) Delete(d *DB, key string) error { return d.Delete(string(b), key) }

// List returns every record, in key order.
func (b Bucket[T]) List(d *DB) ([]T, error) { return List[T](d, string(b)) }

// ListBy returns the records ix finds for value, in key order; ix must be
// an index of this bucket.
func (b Bucket[T]) ListBy(d *DB, ix *Index, value string) ([]T, error) {
	return ListBy[T](d, ix, value)
}
