package core

// An Option switches off one of the manager's optimizations, for
// comparing with and without it (molt bench, the daemon's on/off flags,
// tests). They are options to Open rather than fields of Config so that
// Config holds only what a deployment configures; every default is the
// optimization on.
type Option func(*options)

// options are the switches Open was given. The zero value is production.
type options struct {
	// noScheduler runs background work unscheduled, each job at once.
	noScheduler bool
	// noFavorDynMods leaves the host's cgroup2 mount options alone
	// (dynmods.go).
	noFavorDynMods bool
	// noCOWCapture makes every full checkpoint copy the processes'
	// memory while the sandbox is frozen (meta.Checkpoint.Capture "copy").
	noCOWCapture bool
	// noTemplateCapture keeps full checkpoints from copying the tree in
	// the frozen window and dumping the copies after the thaw
	// (meta.Checkpoint.Capture "template"; internal/capture).
	noTemplateCapture bool
	// noDiskQuota leaves quotas off in the pool (quota.go).
	noDiskQuota bool
	// noLazyResume makes a resume from the store fetch every page
	// before the restore (lazy.go).
	noLazyResume bool
	// noTreeBase makes a fetch from the store take a file tree whole,
	// not over the image the sandbox was made from (offload.go).
	noTreeBase bool
	// noPrecopy keeps a migration from sending the sandbox's memory to
	// the store before freezing it (precopy.go).
	noPrecopy bool
}

// WithoutScheduler runs checkpoint background work unscheduled, each job
// at once on its own goroutine, with no bound on concurrent captures.
func WithoutScheduler() Option { return func(o *options) { o.noScheduler = true } }

// WithoutFavorDynMods leaves the host's cgroup2 mount options alone. By
// default the manager sets favordynmods on it and keeps it set, so that
// moving a task between cgroups (every restore does) does not wait for an
// RCU grace period; forks and exits then cost a little more host-wide.
func WithoutFavorDynMods() Option { return func(o *options) { o.noFavorDynMods = true } }

// WithoutCOWCapture makes every full checkpoint copy the processes'
// memory while the sandbox is frozen (meta.Checkpoint.Capture "copy"),
// as before copy-on-write capture.
func WithoutCOWCapture() Option { return func(o *options) { o.noCOWCapture = true } }

// WithoutTemplateCapture keeps full checkpoints from copying the tree in
// the frozen window and dumping the copies after the thaw
// (meta.Checkpoint.Capture "template"; internal/capture).
func WithoutTemplateCapture() Option { return func(o *options) { o.noTemplateCapture = true } }

// WithoutDiskQuota leaves btrfs quotas off in the pool.
func WithoutDiskQuota() Option { return func(o *options) { o.noDiskQuota = true } }

// WithoutLazyResume makes a resume from the store fetch and check every
// page before the restore, instead of restoring with the lazy-pages
// daemon and bringing the memory on demand (lazy.go).
func WithoutLazyResume() Option { return func(o *options) { o.noLazyResume = true } }
