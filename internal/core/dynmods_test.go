package core

import (
	"context"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/testutil"
)

func dynModsOn(t *testing.T) bool {
	t.Helper()
	st, err := cgroup.DynMods()
	if err != nil {
		testutil.Unavailable(t, "no cgroup2 mount: "+err.Error())
	}
	return st.Enabled
}

// TestFavorDynMods: a manager sets favordynmods on the cgroup2 mount and
// sets it again when another mount clears it; with NoFavorDynMods it
// leaves the mount alone.
func TestFavorDynMods(t *testing.T) {
	testutil.RequireRoot(t)
	was := dynModsOn(t)
	t.Cleanup(func() {
		if _, err := cgroup.SetDynMods(was); err != nil {
			t.Errorf("restore favordynmods=%v: %v", was, err)
		}
	})
	if _, err := cgroup.SetDynMods(false); err != nil {
		t.Fatal(err)
	}

	off, err := Open(context.Background(), Config{Root: t.TempDir(), PoolSize: 1 << 30, NoFavorDynMods: true})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, off)
	if dynModsOn(t) {
		t.Fatal("a manager with NoFavorDynMods set favordynmods")
	}
	if f := off.dynModsFeature(); f.Supported || f.Reason == "" {
		t.Fatalf("feature with the option off: %+v", f)
	}

	m, err := Open(context.Background(), Config{Root: t.TempDir(), PoolSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if !dynModsOn(t) {
		t.Fatal("Open did not set favordynmods")
	}
	if f := m.dynModsFeature(); !f.Supported {
		t.Fatalf("feature: %+v", f)
	}
	// Another cgroup2 mount clears it; the manager sets it again.
	if _, err := cgroup.SetDynMods(false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * dynModsCheck)
	for !dynModsOn(t) {
		if time.Now().After(deadline) {
			t.Fatalf("favordynmods still cleared %v after another mount cleared it", 3*dynModsCheck)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
