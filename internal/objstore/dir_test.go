package objstore_test

import (
	"testing"

	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/objstore/objstoretest"
)

func TestDirConformance(t *testing.T) {
	objstoretest.Run(t, func(t *testing.T) objstore.Bucket {
		d, err := objstore.NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}
