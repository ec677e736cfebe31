package capture

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPlan: the table of trees and configurations against the strategy
// Plan chooses and the reason it gives. Pure: no root, no /proc.
func TestPlan(t *testing.T) {
	const (
		small = 8 << 20
		big   = 100 << 20
		std   = unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC
	)
	for _, c := range []struct {
		name    string
		tree    Tree
		mode    string
		stream  bool
		outside int
		note    string // the capture note, exactly
		why     string // a part of the reason
	}{
		{name: "small tree", tree: Tree{Measured: true, AnonBytes: small},
			mode: Copy, outside: std, why: "8 MiB of private memory, under 32 MiB"},
		{name: "just under the threshold", tree: Tree{Measured: true, AnonBytes: COWMinAnon - 1},
			mode: Copy, outside: std, why: "under 32 MiB"},
		{name: "at the threshold", tree: Tree{Measured: true, AnonBytes: COWMinAnon},
			mode: Template, stream: true, outside: std, why: "can be copied"},
		{name: "big copyable tree", tree: Tree{Measured: true, AnonBytes: big},
			mode: Template, stream: true, outside: std, why: "100 MiB of private memory in a tree that can be copied"},
		{name: "big tree with threads", tree: Tree{Measured: true, AnonBytes: big, TemplateObstacle: "pid 7 has 3 threads"},
			mode: COW, stream: true, outside: std, note: "pid 7 has 3 threads", why: "cannot be copied (pid 7 has 3 threads): copy-on-write"},
		{name: "template off", tree: Tree{Measured: true, AnonBytes: big, Config: Config{NoTemplate: true}},
			mode: COW, stream: true, outside: std, why: "template capture off"},
		{name: "copy-on-write off", tree: Tree{Measured: true, AnonBytes: big, Config: Config{NoCOW: true}},
			mode: Template, outside: std, why: "can be copied"},
		{name: "copy-on-write off, not copyable", tree: Tree{Measured: true, AnonBytes: big, TemplateObstacle: "pid 9 has a terminal open (/dev/pts/0)", Config: Config{NoCOW: true}},
			mode: Copy, outside: std, note: "pid 9 has a terminal open (/dev/pts/0)", why: "copy-on-write is off, a frozen CRIU dump"},
		{name: "both off", tree: Tree{Measured: true, AnonBytes: big, Config: Config{NoCOW: true, NoTemplate: true}},
			mode: Copy, outside: std, why: "copy-on-write and template captures are off"},
		{name: "held frozen", tree: Tree{Measured: true, AnonBytes: big, Config: Config{HoldFrozen: true}},
			mode: Copy, outside: std, why: "stays frozen"},
		{name: "not measured", tree: Tree{AnonBytes: big},
			mode: Copy, outside: std, why: "could not be measured"},
		{name: "System V objects", tree: Tree{Measured: true, AnonBytes: small, SysVIPC: true},
			mode: Copy, outside: unix.CLONE_NEWNET | unix.CLONE_NEWUTS, why: "under 32 MiB"},
		{name: "namespaces in the images", tree: Tree{Measured: true, AnonBytes: big, Config: Config{NamespacesInImages: true}},
			mode: Template, stream: true, outside: 0, why: "can be copied"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Plan(c.tree)
			if s.Mode != c.mode || s.Stream != c.stream || s.Outside != c.outside || s.Note != c.note {
				t.Errorf("Plan = {Mode %q Stream %v Outside %#x Note %q}, want {%q %v %#x %q}",
					s.Mode, s.Stream, s.Outside, s.Note, c.mode, c.stream, c.outside, c.note)
			}
			if !strings.Contains(s.Why, c.why) {
				t.Errorf("Why = %q, want it to say %q", s.Why, c.why)
			}
		})
	}
}

// TestPlanWantsTemplate: Inspect reads the template's obstacles exactly
// for the trees Plan would copy.
func TestPlanWantsTemplate(t *testing.T) {
	for _, tree := range []Tree{
		{Measured: true, AnonBytes: 1 << 20},
		{Measured: true, AnonBytes: 64 << 20},
		{Measured: true, AnonBytes: 64 << 20, Config: Config{NoTemplate: true}},
		{Measured: true, AnonBytes: 64 << 20, Config: Config{NoCOW: true}},
		{Measured: true, AnonBytes: 64 << 20, Config: Config{HoldFrozen: true}},
		{AnonBytes: 64 << 20},
	} {
		if got, want := tree.wantsTemplate(), Plan(tree).Mode == Template; got != want {
			t.Errorf("%+v: wantsTemplate %v, Plan's mode %q", tree, got, Plan(tree).Mode)
		}
	}
}
