package core

import (
	"errors"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// dynModsCheck is how often the daemon checks that the cgroup2 mount still
// favours dynamic modifications: any new cgroup2 mount on the host (a
// plain `criu restore` that manages cgroups, another runtime) sets the
// hierarchy's flags from its own options and so clears it.
const dynModsCheck = 2 * time.Second

// favorDynMods sets favordynmods on the host's cgroup2 mount, so that the
// cgroup moves on molt's restore paths (a fork's CRIU into the new
// sandbox's cgroups, spares, standbys) do not each wait for an RCU grace
// period, and keeps it set while the manager is open. See
// docs/architecture.md, "cgroup moves".
func (m *Manager) favorDynMods() {
	if m.opts.noFavorDynMods {
		return
	}
	m.ensureDynMods(true)
	go m.every(dynModsCheck, func() { m.ensureDynMods(false) })
}

// every runs f every d until the Manager closes.
func (m *Manager) every(d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
			f()
		}
	}
}

// ensureDynMods sets favordynmods if it is not set and reports whether
// it did. Other molt daemons on the host do the same, which is harmless.
func (m *Manager) ensureDynMods(first bool) bool {
	changed, err := cgroup.EnableDynMods()
	switch {
	case errors.Is(err, errdefs.ErrNotSupported):
	case err != nil:
		if first {
			m.log.Warn("cgroup moves stay slow: cannot set favordynmods on the cgroup2 mount", "err", err)
		}
	case changed && !first:
		m.log.Info("favordynmods was cleared on the cgroup2 mount (by another cgroup2 mount); set it again")
	case changed:
		m.log.Info("set favordynmods on the cgroup2 mount: cgroup moves no longer wait for RCU grace periods")
	}
	if changed {
		m.dynModsSets.Add(1)
	}
	return changed
}

// dynModsFeature reports the state for Host.
func (m *Manager) dynModsFeature() meta.Feature {
	f := meta.Feature{Name: "cgroup-favordynmods"}
	st, err := cgroup.DynMods()
	switch {
	case err != nil:
		f.Reason = err.Error()
	case st.Enabled:
		f.Supported, f.Detail = true, st.Mount+": cgroup moves skip RCU grace periods"
	case m.opts.noFavorDynMods:
		f.Reason = "off (daemon started with --cgroup-favordynmods=false): each cgroup move waits for an RCU grace period"
	default:
		f.Reason = "not set on " + st.Mount
	}
	return f
}
