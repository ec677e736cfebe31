package main

import (
	"testing"

	"github.com/molt-sh/molt/internal/core"
)

// TestWithout: an on/off flag left on adds no option, one turned off adds
// the option that switches its optimization off.
func TestWithout(t *testing.T) {
	opt := core.WithoutCOWCapture()
	if got := without(true, opt); len(got) != 0 {
		t.Errorf("flag on: %d options, want none", len(got))
	}
	if got := without(false, opt); len(got) != 1 || got[0] == nil {
		t.Errorf("flag off: %v, want the option", got)
	}
}
