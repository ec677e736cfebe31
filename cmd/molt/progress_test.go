package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
)

// TestProgressPlain: off a terminal each new stage is a line, a
// measured stage's updates come at most every plainEvery (its end at
// once), and the lines say how far and how long.
func TestProgressPlain(t *testing.T) {
	var buf bytes.Buffer
	d := newProgressDisplay(&buf, "hibernate sb", false)
	d.update(v1.Progress{Message: "capturing"})
	d.update(v1.Progress{Message: "storing", Done: 1 << 20, Total: 4 << 20, Unit: "bytes"})
	d.update(v1.Progress{Message: "storing", Done: 2 << 20, Total: 4 << 20, Unit: "bytes"}) // throttled
	d.update(v1.Progress{Message: "storing", Done: 4 << 20, Total: 4 << 20, Unit: "bytes"})
	d.update(v1.Progress{Message: "forking", Done: 3, Total: 8})
	d.stop()
	d.update(v1.Progress{Message: "after the end"})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		"hibernate sb: capturing (0s)",
		"hibernate sb: storing [#####---------------]  25% 1.0 MiB/4.0 MiB (0s)",
		"hibernate sb: storing [####################] 100% 4.0 MiB/4.0 MiB (0s)",
		"hibernate sb: forking [#######-------------]  37% 3/8 (0s)",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("plain progress:\n%s\nwant:\n%s", buf.String(), strings.Join(want, "\n"))
	}
}

// TestProgressTerminal: on a terminal the line is redrawn in place and
// cleared at the end.
func TestProgressTerminal(t *testing.T) {
	var buf bytes.Buffer
	d := newProgressDisplay(&buf, "image build default", true)
	d.update(v1.Progress{Message: "I: Retrieving Packages"})
	time.Sleep(3 * redraw)
	d.stop()
	out := buf.String()
	if !strings.Contains(out, "\r\x1b[K") || !strings.Contains(out, "image build default: I: Retrieving Packages") || !strings.HasSuffix(out, "\r\x1b[K") || strings.Contains(out, "\n") {
		t.Fatalf("terminal progress: %q", out)
	}
}
