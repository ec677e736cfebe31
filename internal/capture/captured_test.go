package capture

import (
	"os"
	"path/filepath"
	"testing"
)

// capturedWith returns a Captured owning a staging directory (removed
// by its Release, which counts its calls in released) and room for
// copies (given back by room, counted in roomed).
func capturedWith(t *testing.T, released, roomed *int) (*Captured, string) {
	t.Helper()
	staging := filepath.Join(t.TempDir(), "staging")
	if err := os.Mkdir(staging, 0o700); err != nil {
		t.Fatal(err)
	}
	c := &Captured{Mode: Template, o: &owned{
		t: Target{Staging: staging, Release: func() {
			*released++
			os.RemoveAll(staging)
		}},
		room: func() { *roomed++ },
	}}
	return c, staging
}

// TestCapturedClose: Close releases what the capture owns once, however
// often it is called.
func TestCapturedClose(t *testing.T) {
	var released, roomed int
	c, staging := capturedWith(t, &released, &roomed)
	if c.Staging() != staging {
		t.Fatalf("Staging %q, want %q", c.Staging(), staging)
	}
	c.Close()
	c.Close()
	if released != 1 || roomed != 1 {
		t.Fatalf("released %d times, room given back %d times; want once each", released, roomed)
	}
	if _, err := os.Stat(staging); !os.IsNotExist(err) {
		t.Fatalf("staging still there after Close: %v", err)
	}
}

// TestCapturedHand: after Hand, the capturer's Close releases nothing;
// the new owner's Close releases everything, once.
func TestCapturedHand(t *testing.T) {
	var released, roomed int
	c, staging := capturedWith(t, &released, &roomed)
	c.Note = "why"
	held := c.Hand()
	c.Close()
	if released != 0 || roomed != 0 {
		t.Fatalf("the capturer's Close after Hand released (%d, %d)", released, roomed)
	}
	if _, err := os.Stat(staging); err != nil {
		t.Fatalf("staging gone after the capturer's Close: %v", err)
	}
	if held.Mode != Template || held.Note != "why" || held.Staging() != staging {
		t.Fatalf("handed capture %+v lost its facts", held)
	}
	if err := held.Finish(); err != nil {
		t.Fatalf("Finish with nothing to finish: %v", err)
	}
	held.Close()
	held.Close()
	if released != 1 || roomed != 1 {
		t.Fatalf("released %d times, room given back %d times; want once each", released, roomed)
	}
}

// TestCapturedStartWithoutCopies: Start does nothing for a capture that
// holds no copies, and Close does not wait for dumps never started.
func TestCapturedStartWithoutCopies(t *testing.T) {
	var released, roomed int
	c, _ := capturedWith(t, &released, &roomed)
	called := false
	c.Start(func() { called = true })
	c.Close()
	if called || released != 1 {
		t.Fatalf("done called %v, released %d", called, released)
	}
}
