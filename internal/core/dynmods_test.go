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
// sets it again when another mount clears it; with WithoutFavorDynMods it
// never touches the mount. Other molt daemons on the host may set the
// option too, so the test counts what this manager did rather than only
// reading the mount.
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
	off, err := Open(context.Background(), Config{Root: t.TempDir(), PoolSize: 1 << 30}, WithoutFavorDynMods())
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, off)
	if n := off.dynModsSets.Load(); n != 0 {
		t.Fatalf("a manager with WithoutFavorDynMods set favordynmods %d times", n)
	}

	m, err := Open(context.Background(), Config{Root: t.TempDir(), PoolSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if !dynModsOn(t) {
		t.Fatal("favordynmods not set after Open")
	}
	if f := m.dynModsFeature(); !f.Supported {
		t.Fatalf("feature: %+v", f)
	}
	// Another cgroup2 mount clears it: one check sets it again (unless
	// another daemon was quicker), and so does the manager's own ticker.
	if _, err := cgroup.SetDynMods(false); err != nil {
		t.Fatal(err)
	}
	if !m.ensureDynMods(false) && !dynModsOn(t) {
		t.Fatal("ensureDynMods neither set favordynmods nor found it set")
	}
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
	if f := off.dynModsFeature(); !f.Supported {
		t.Fatalf("feature of the manager that leaves the mount alone, with the option set: %+v", f)
	}
}
