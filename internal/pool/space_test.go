package pool_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/errdefs"
	"golang.org/x/sys/unix"
)

// TestRoom: a loop pool reports its own free space and its backing
// filesystem's, and Room refuses what would eat into the reserve of
// either, saying which.
func TestRoom(t *testing.T) {
	p := open(t, loopRoot(t))
	s, err := p.Space()
	if err != nil {
		t.Fatal(err)
	}
	if s.Size <= 0 || s.Free <= 0 || s.Free > s.Size || s.BackingFree < 0 {
		t.Fatalf("space %+v", s)
	}
	if err := p.Room(0, s.Free/2); err != nil {
		t.Fatalf("room with half the pool free: %v", err)
	}
	err = p.Room(s.Free, 1<<20)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "pool "+p.Dir+" has") {
		t.Fatalf("room for all the free space and a reserve: %v", err)
	}
	// A file in the pool counts.
	f, err := os.Create(filepath.Join(p.Dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, s.Free/2); err != nil {
		t.Fatal(err)
	}
	_ = unix.Syncfs(int(f.Fd()))
	if s2, _ := p.Space(); s2.Free > s.Free-s.Free/4 {
		t.Fatalf("free %d after filling half of %d", s2.Free, s.Free)
	}
}
