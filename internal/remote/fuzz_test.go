package remote

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/objstore"
)

// FuzzDecodeRecipe feeds arbitrary bytes to the recipe decoder, as a
// store anyone can write to may hold: it must refuse or accept without
// panicking, and what it accepts must keep every name inside its
// checkpoint and every extent within its object.
func FuzzDecodeRecipe(f *testing.F) {
	k, err := ckstore.LoadKeyring(f.TempDir(), nil)
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	root := f.TempDir()
	b, _ := objstore.NewDir(root)
	s, err := Open(ctx, b, k)
	if err != nil {
		f.Fatal(err)
	}
	src := artifact(f, "ck0000000001", make([]byte, 8*4096), "seed")
	if _, _, err := s.Upload(ctx, src); err != nil {
		f.Fatal(err)
	}
	seed, err := readAll(ctx, b, recipeKey("ck0000000001"), maxRecipe)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"layout":1,"checkpoint":"ck0000000001","sandbox":"sb0000000001","objects":[{"name":"../x","size":1,"sha256":"","extents":[{"p":0,"o":0,"n":1}]}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := decodeRecipe(in, "ck0000000001", k)
		if err != nil {
			return
		}
		for _, o := range r.Objects {
			if !ckstore.IsPath(o.Name) || filepath.IsAbs(o.Name) {
				t.Fatalf("accepted object name %q", o.Name)
			}
			var n int64
			for _, e := range o.Extents {
				if e.P < 0 || e.P >= len(r.Packs) || e.Len <= 0 {
					t.Fatalf("accepted extent %+v", e)
				}
				n += e.Len
			}
			if n != o.Size {
				t.Fatalf("accepted object %s of %d bytes with extents of %d", o.Name, o.Size, n)
			}
			if o.Cuts != "" {
				t.Fatalf("accepted chunk lengths for object %s", o.Name)
			}
		}
		if r.Tree != nil {
			if _, err := decodeCuts(r.Tree.Cuts, r.Tree.Size); err != nil {
				t.Fatalf("accepted a tree whose chunks do not decode: %v", err)
			}
		}
	})
}
