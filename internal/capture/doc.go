// Package capture takes a sandbox's process tree at one instant for a
// full checkpoint: the frozen window, from the freeze to the thaw.
//
// Plan chooses, from what Inspect read of the tree before the freeze and
// the daemon's configuration, how: a template capture (every process
// copied in the frozen window, the copies dumped after the thaw),
// copy-on-write (the tree's memory write-protected, its pages copied
// after the thaw), or a frozen CRIU dump; and which namespaces stay out
// of the images. Plan reads nothing but its argument.
//
// Run carries the plan out, falling back when the tree turns out, once
// frozen, not to allow it, and returns a Captured: the images in a
// staging directory, with what they still need (the copies to dump, the
// pages the stream holds). A Captured owns the staging and work
// directories, the stream and the copies; it has one owner at a time,
// which hands it on with Hand and releases it with Close.
//
// Invariants: files and processes come from one freeze (the root's
// snapshot is taken frozen, next to CRIU or the copies); every frozen
// window has a deadline (Watch), past which the sandbox is thawed and
// the capture fails; a failed Run leaves the sandbox thawed and has
// released all it was handed.
// The package starts no goroutine that outlives its owner's Close but
// the copies' dumps (Start), which Close waits for.
package capture
