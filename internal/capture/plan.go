package capture

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Capture modes of a full checkpoint (v1.Checkpoint.Capture).
const (
	// Copy: CRIU copies every private page while the tree is frozen
	// (about 0.5 ms per MiB here).
	Copy = "copy"
	// COW (copy-on-write): in the frozen window molt write-protects the
	// tree's private memory (an injected fork, killed at once) and CRIU
	// hands its pages over by reference (criu.Stream); they are copied
	// after the thaw, and a process that writes a page meanwhile gets a
	// copy of its own.
	COW = "copy-on-write"
	// Template: in the frozen window molt copies every process of the
	// tree (an injected clone each; pid1 copies itself), and CRIU dumps
	// each copy on its own after the thaw; the dumps are merged into the
	// tree's images (criu.Merge). No CRIU in the frozen window: it holds
	// the freeze, the copies (about 1-2 ms for a 100 MiB heap) and the
	// root's snapshot.
	Template = "template"
)

// Config is what the daemon's configuration says about captures.
type Config struct {
	// HoldFrozen leaves the sandbox frozen after the capture (a fork of
	// a frozen instant): only a frozen CRIU dump can.
	HoldFrozen bool
	// NoCOW and NoTemplate turn the copy-on-write and template captures
	// off (core.WithoutCOWCapture, WithoutTemplateCapture: for comparisons).
	NoCOW, NoTemplate bool
	// NamespacesInImages dumps the network, UTS and IPC namespaces as
	// well (tests: molt's captures before it left them out).
	NamespacesInImages bool
}

// Tree is what Plan decides from: the configuration and the sandbox's
// process tree as Inspect read it before the freeze.
type Tree struct {
	Config
	// Measured says AnonBytes and Procs could be read; a tree that could
	// not be measured counts as small.
	Measured bool
	// AnonBytes is the live tree's resident private memory, Procs its
	// number of processes.
	AnonBytes int64
	Procs     int
	// SysVIPC says the tree's IPC namespace holds System V objects,
	// which live in the namespace, not in a process.
	SysVIPC bool
	// TemplateObstacle says why the tree cannot be copied ("" if it
	// can); read only for a tree big enough to be (wantsTemplate).
	TemplateObstacle string
}

// big says whether the tree has enough private memory for a capture
// that takes it after the thaw (copy-on-write or template).
func (t Tree) big() bool {
	return t.Measured && t.AnonBytes >= COWMinAnon && !t.HoldFrozen
}

// wantsTemplate says whether the tree would be captured by copies if it
// can be: then Inspect reads what could keep it from it.
func (t Tree) wantsTemplate() bool { return t.big() && !t.NoTemplate }

// Strategy is how a capture takes a tree.
type Strategy struct {
	// Mode is the path tried first: Template, COW or Copy. Run falls
	// back from Template to COW (or Copy without Stream) for a tree
	// found, once frozen, not to be copyable, and from COW to Copy for
	// one it cannot write-protect; Captured.Mode says what was done.
	Mode string
	// Stream has CRIU stream its images to the daemon, which is what
	// copy-on-write needs.
	Stream bool
	// Outside are the namespace types (CLONE_NEW*) that stay out of the
	// images: CRIU runs in the sandbox's own, and a restore gives the
	// tree fresh ones.
	Outside int
	// Note says what kept a tree that would have been captured after
	// the thaw from its better path (v1.Checkpoint.CaptureNote), "" if
	// nothing did.
	Note string
	// Why explains the choice, for people.
	Why string
}

// Plan chooses how to capture tree. It reads nothing but tree.
//
// The sandbox's network, UTS and (when it holds no System V objects)
// IPC namespaces stay out of the images, and so do its cgroups: CRIU
// runs in those namespaces (a tree in CRIU's own namespace leaves it
// out), and a restore gives the tree fresh ones and the sandbox's
// cgroup. Dumping them took about 40 ms of the frozen window here (a
// fork of CRIU per namespace, the host's connection-tracking table
// scanned twice, the cgroups). Nothing inside a sandbox can configure
// them (no CAP_NET_ADMIN or CAP_SYS_ADMIN, /proc/sys read-only), so
// fresh ones equal the dumped ones: loopback up, the sandbox's
// hostname, no IPC objects.
//
// A tree with much private memory is captured copy-on-write when it can
// be (cow.go); CRIU then streams its images to the daemon. Better still,
// a tree that can be copied is copied in the frozen window and dumped
// after the thaw (copies.go).
func Plan(tree Tree) Strategy {
	s := Strategy{Mode: Copy, Outside: unix.CLONE_NEWNET | unix.CLONE_NEWUTS}
	if !tree.SysVIPC {
		s.Outside |= unix.CLONE_NEWIPC
	}
	if tree.NamespacesInImages {
		s.Outside = 0
	}
	mib := tree.AnonBytes >> 20
	switch {
	case !tree.Measured:
		s.Why = "the tree's memory could not be measured: a frozen CRIU dump"
		return s
	case tree.HoldFrozen:
		s.Why = "the sandbox stays frozen after the capture: a frozen CRIU dump"
		return s
	case !tree.big():
		s.Why = fmt.Sprintf("%d MiB of private memory, under %d MiB: CRIU copies it frozen for less than a write protection costs", mib, COWMinAnon>>20)
		return s
	}
	s.Stream = !tree.NoCOW
	if s.Stream {
		s.Mode = COW
	}
	switch {
	case tree.NoTemplate && tree.NoCOW:
		s.Why = fmt.Sprintf("%d MiB of private memory, but copy-on-write and template captures are off: a frozen CRIU dump", mib)
	case tree.NoTemplate:
		s.Why = fmt.Sprintf("%d MiB of private memory, template capture off: copy-on-write", mib)
	case tree.TemplateObstacle != "":
		s.Note = tree.TemplateObstacle
		s.Why = fmt.Sprintf("%d MiB of private memory, but the tree cannot be copied (%s): ", mib, tree.TemplateObstacle)
		if s.Stream {
			s.Why += "copy-on-write"
		} else {
			s.Why += "copy-on-write is off, a frozen CRIU dump"
		}
	default:
		s.Mode = Template
		s.Why = fmt.Sprintf("%d MiB of private memory in a tree that can be copied: copies in the frozen window, dumped after the thaw", mib)
	}
	return s
}

// Inspect reads the tree of init for Plan, before the freeze: pids are
// its live processes (the sandbox's standbys left out), measured false
// if they could not be listed. It reads what could keep the tree from a
// template capture only for a tree that would get one.
func Inspect(init int, pids []int, measured bool, cfg Config) (Tree, error) {
	tree := Tree{Config: cfg, Measured: measured}
	var err error
	if tree.SysVIPC, err = sysvIPCInUse(init); err != nil {
		return Tree{}, err
	}
	if measured {
		tree.AnonBytes, tree.Procs = AnonBytes(pids), len(pids)
	}
	if tree.wantsTemplate() {
		tree.TemplateObstacle = templateObstacle(init, pids)
	}
	return tree, nil
}
