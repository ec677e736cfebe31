package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/units"
)

// How progress is shown: a terminal's line is redrawn every redraw; plain
// output gets a stage's measured progress at most every plainEvery, and
// a line every heartbeat while nothing comes, so a long operation never
// sits silent.
const (
	redraw     = 150 * time.Millisecond
	plainEvery = 2 * time.Second
	heartbeat  = 5 * time.Second
)

// progressDisplay shows one operation's progress on stderr.
type progressDisplay struct {
	out   io.Writer
	tty   bool
	title string    // +checklocks:mu
	width int       // +checklocks:mu
	start time.Time // +checklocks:mu

	mu      sync.Mutex
	cur     v1.Progress // +checklocks:mu
	printed time.Time   // +checklocks:mu
	lastMsg string      // +checklocks:mu
	stopped bool        // +checklocks:mu

	quit chan struct{}
	done chan struct{}
}

// withProgress returns ctx asking the daemon for the progress of the
// calls made with it, shown under title until the returned stop is
// called.
func withProgress(ctx context.Context, title string) (context.Context, func()) {
	d := newProgressDisplay(os.Stderr, title, isTerminal(os.Stderr))
	return client.WithProgress(ctx, d.update), d.stop
}

func newProgressDisplay(out io.Writer, title string, tty bool) *progressDisplay {
	d := &progressDisplay{title: title, out: out, tty: tty, width: 80, start: time.Now(), quit: make(chan struct{}), done: make(chan struct{})}
	if f, ok := out.(*os.File); ok && tty {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col >= 20 {
			d.width = int(ws.Col)
		}
	}
	d.mu.Lock()
	d.printed = d.start
	d.mu.Unlock()
	go d.loop()
	return d
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func (d *progressDisplay) update(p v1.Progress) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	d.cur = p
	if d.tty {
		return // the loop draws
	}
	now := time.Now()
	if p.Message != d.lastMsg || (p.Total > 0 && p.Done >= p.Total) || now.Sub(d.printed) >= plainEvery {
		d.plain(now)
	}
}

// plain prints the current state as one line.
// +checklocks:d.mu
func (d *progressDisplay) plain(now time.Time) {
	fmt.Fprintln(d.out, d.line(now))
	d.printed, d.lastMsg = now, d.cur.Message
}

func (d *progressDisplay) loop() {
	defer close(d.done)
	every := heartbeat
	if d.tty {
		every = redraw
	}
	t := time.NewTicker(every)
	defer t.Stop()
	frame := 0
	for {
		select {
		case <-d.quit:
			return
		case now := <-t.C:
			d.mu.Lock()
			if d.tty {
				frame++
				fmt.Fprintf(d.out, "\r\x1b[K%c %s", spinner[frame%len(spinner)], clip(d.line(now), d.width-3))
			} else if now.Sub(d.printed) >= heartbeat {
				d.plain(now)
			}
			d.mu.Unlock()
		}
	}
}

const spinner = `|/-\`

// line renders the state: title, stage, a bar when measured, and the
// time so far.
// +checklocks:d.mu
func (d *progressDisplay) line(now time.Time) string {
	var b strings.Builder
	b.WriteString(d.title)
	p := d.cur
	if p.Message != "" {
		b.WriteString(": ")
		b.WriteString(p.Message)
	}
	if p.Total > 0 {
		done := min(p.Done, p.Total)
		const cells = 20
		fill := int(done * cells / p.Total)
		fmt.Fprintf(&b, " [%s%s] %3d%% %s/%s", strings.Repeat("#", fill), strings.Repeat("-", cells-fill), done*100/p.Total, amount(done, p.Unit), amount(p.Total, p.Unit))
	} else if p.Done > 0 {
		fmt.Fprintf(&b, " %s", amount(p.Done, p.Unit))
	}
	fmt.Fprintf(&b, " (%.0fs)", now.Sub(d.start).Seconds())
	return b.String()
}

// amount renders n of unit: bytes in binary units, counts as they are.
func amount(n int64, unit string) string {
	if unit != "bytes" {
		return fmt.Sprint(n)
	}
	return units.Bytes(n)
}

func clip(s string, width int) string {
	if r := []rune(s); len(r) > width && width > 0 {
		return string(r[:width])
	}
	return s
}

// stop ends the display: a terminal's line is cleared.
func (d *progressDisplay) stop() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return
	}
	d.stopped = true
	d.mu.Unlock()
	close(d.quit)
	<-d.done
	if d.tty {
		fmt.Fprint(d.out, "\r\x1b[K")
	}
}
