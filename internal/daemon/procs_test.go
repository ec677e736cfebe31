package daemon

import (
	"runtime"
	"testing"
)

func TestProcsFor(t *testing.T) {
	for _, c := range []struct {
		env        string
		cpus, want int
	}{
		{"", 2, 2 + extraProcs},
		{"", 64, 64 + extraProcs},
		{"3", 3, 3}, // the runtime took the variable already
	} {
		if got := procsFor(c.env, c.cpus); got != c.want {
			t.Errorf("procsFor(%q, %d) = %d, want %d", c.env, c.cpus, got, c.want)
		}
	}
}

// TestSetProcs: the daemon raises GOMAXPROCS above the runtime's default
// (unless the environment sets it).
func TestSetProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	setProcs()
	if got := runtime.GOMAXPROCS(0); got != before+extraProcs {
		t.Fatalf("GOMAXPROCS %d after setProcs, want %d", got, before+extraProcs)
	}
}
