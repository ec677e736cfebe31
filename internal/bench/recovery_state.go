// The recovery benchmark's view of a sandbox's final state, and the
// comparison of a recovered run's with a fault-free run's.

package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
)

// State is what the benchmark compares of a run's end.
type State struct {
	// Files maps a path to "type mode size content" (content: a hash,
	// a symlink's target, or the mtime of a file the run never wrote).
	Files map[string]string `json:"-"`
	// Sessions maps a session to the digest of its shell state.
	Sessions map[string]string `json:"sessions"`
	// SessionText is the state text each digest is of (for reports).
	SessionText map[string]string `json:"-"`
	// Processes are the long-lived processes' "comm args", sorted.
	Processes []string `json:"processes"`
	// Effects counts what the payment service received of each
	// logical effect of the run.
	Effects map[string]int `json:"effects"`
}

// VolatilePatterns are paths whose contents change by themselves or
// differ between any two sandboxes; the comparison skips them, and the
// output lists them (with those two fault-free runs disagreed on).
var VolatilePatterns = []string{
	"/etc/hostname", "/etc/hosts", "/etc/machine-id", "/etc/resolv.conf",
	"**/__pycache__/**", "**/*.pyc",
	"/root/.cache/**", "/var/cache/**", "/var/log/**", "/tmp/.molt*",
}

// matchVolatile reports whether p matches a pattern: "**/" any leading
// directories, "/**" anything below, "*" within one element.
func matchVolatile(p string, patterns []string) bool {
	for _, pat := range patterns {
		if globMatch(pat, p) {
			return true
		}
	}
	return false
}

func globMatch(pat, p string) bool {
	if rest, ok := strings.CutPrefix(pat, "**/"); ok {
		if globMatch("/"+rest, p) {
			return true
		}
		for i := 1; i < len(p); i++ {
			if p[i] == '/' && globMatch("/"+rest, p[i:]) {
				return true
			}
		}
		return false
	}
	if pre, ok := strings.CutSuffix(pat, "/**"); ok {
		if i := strings.Index(pre, "**"); i >= 0 {
			// "**/x/**": x anywhere, anything below.
			for j := 0; j < len(p); j++ {
				if (j == 0 || p[j] == '/') && globPrefix(pre[i+2:], p[j:]) {
					return true
				}
			}
			return false
		}
		return globPrefix(pre, p)
	}
	ok, _ := path.Match(pat, p)
	return ok
}

// globPrefix: p is pre or below it (pre's elements may hold "*").
func globPrefix(pre, p string) bool {
	n := strings.Count(pre, "/")
	parts := strings.SplitAfterN(p, "/", n+2)
	if len(parts) < n+1 {
		return false
	}
	head := strings.TrimSuffix(strings.Join(parts[:n+1], ""), "/")
	ok, _ := path.Match(pre, head)
	return ok
}

// snapshotFilesPy lists the sandbox's root filesystem (not /proc, /sys,
// /dev, /run or other mounts): type, mode, size, and a content hash for
// files written since argv[1] (unix seconds), the mtime for the others
// (they are the image's), a symlink's target.
const snapshotFilesPy = `import os, sys, hashlib, stat
since = float(sys.argv[1])
root_dev = os.lstat("/").st_dev
out = sys.stdout
def emit(p, st):
    m = st.st_mode
    if stat.S_ISDIR(m):
        out.write("%s\td %o\n" % (p, stat.S_IMODE(m))); return
    if stat.S_ISLNK(m):
        out.write("%s\tl %s\n" % (p, os.readlink(p))); return
    if stat.S_ISREG(m):
        if st.st_mtime >= since:
            h = hashlib.sha256()
            try:
                with open(p, "rb") as f:
                    for b in iter(lambda: f.read(1 << 20), b""):
                        h.update(b)
                c = h.hexdigest()
            except OSError as e:
                c = "unreadable"
        else:
            c = "m%d" % st.st_mtime_ns
        out.write("%s\tf %o %d %s\n" % (p, stat.S_IMODE(m), st.st_size, c)); return
    out.write("%s\to %o %o\n" % (p, stat.S_IFMT(m), stat.S_IMODE(m)))
for d, dirs, files in os.walk("/"):
    keep = []
    for n in sorted(dirs):
        p = os.path.join(d, n)
        if p in ("/proc", "/sys", "/dev", "/run"):
            continue
        try:
            st = os.lstat(p)
        except OSError:
            continue
        emit(p, st)
        if st.st_dev == root_dev and not stat.S_ISLNK(st.st_mode):
            keep.append(n)
    dirs[:] = keep
    for n in sorted(files):
        p = os.path.join(d, n)
        try:
            emit(p, os.lstat(p))
        except OSError:
            pass
`

// processesPy lists the sandbox's processes but itself: "comm args".
const processesPy = `import os
me = os.getpid()
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == me:
        continue
    try:
        comm = open("/proc/%s/comm" % p).read().strip()
        args = open("/proc/%s/cmdline" % p, "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    print("%s %s" % (comm, args))
`

// sessionStateCmd prints a session's shell state with builtins only, as
// molt's own session digest reads it (internal/sbinit), plus the cwd.
const sessionStateCmd = `{ declare -p; printf '\037\n'; declare -f; alias -p; shopt -p; set +o; umask -p; trap -p; dirs -l -p; pwd; } 2>/dev/null`

// volatileVarRE matches a declare -p line of a variable that changes by
// itself or with each call, molt's session loop's own, and HOSTNAME (a
// new sandbox's identity is its own).
var volatileVarRE = regexp.MustCompile(`^declare -[-a-zA-Z]* (BASH_COMMAND|BASH_LINENO|BASH_SOURCE|BASH_ARGC|BASH_ARGV|BASH_SUBSHELL|BASHPID|FUNCNAME|LINENO|RANDOM|SRANDOM|SECONDS|EPOCHSECONDS|EPOCHREALTIME|HISTCMD|PIPESTATUS|_|COLUMNS|LINES|PPID|HOSTNAME|__molt_[A-Za-z0-9_]*)(=|$)`)

// SessionLinesDiff lists the lines of session state text b that a
// lacks and the other way round, without the volatile variables.
func SessionLinesDiff(a, b string) []string {
	in := func(t string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(t, "\n") {
			if !volatileVarRE.MatchString(l) {
				m[l] = true
			}
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range sortedKeys(ma) {
		if !mb[l] {
			out = append(out, "-"+l)
		}
	}
	for _, l := range sortedKeys(mb) {
		if !ma[l] {
			out = append(out, "+"+l)
		}
	}
	return out
}

// SessionDigest digests a session's state text without its volatile
// variables.
func SessionDigest(text string) string {
	h := sha256.New()
	for _, l := range strings.Split(text, "\n") {
		if volatileVarRE.MatchString(l) {
			continue
		}
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// SnapshotState reads a sandbox's files (its commands run aside: they
// are not the agent's) (written since the unix time
// since hashed), sessions and processes.
func SnapshotState(ctx context.Context, c *client.Client, sb string, since float64) (State, error) {
	st := State{Files: map[string]string{}, Sessions: map[string]string{}, SessionText: map[string]string{}}
	var out, errb bytes.Buffer
	es, err := c.Exec(ctx, sb, v1.ExecRequest{Args: []string{"python3", "-c", snapshotFilesPy, strconv.FormatFloat(since, 'f', 3, 64)}, Aside: true}, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err == nil && es.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", es.ExitCode, shorten(errb.String(), 200))
	}
	if err != nil {
		return st, fmt.Errorf("file tree: %w", err)
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if p, v, ok := strings.Cut(sc.Text(), "\t"); ok {
			st.Files[p] = v
		}
	}
	info, err := c.Sandbox(ctx, sb)
	if err != nil {
		return st, err
	}
	for _, s := range info.Sessions {
		if !s.Alive {
			continue
		}
		res, err := c.SessionRun(ctx, sb, s.Name, v1.SessionRunRequest{Command: sessionStateCmd, TimeoutMS: 10000, Aside: true})
		if err != nil {
			return st, fmt.Errorf("session %s: %w", s.Name, err)
		}
		st.Sessions[s.Name] = SessionDigest(res.Stdout)
		st.SessionText[s.Name] = res.Stdout
	}
	out.Reset()
	errb.Reset()
	es, err = c.Exec(ctx, sb, v1.ExecRequest{Args: []string{"python3", "-c", processesPy}, Aside: true}, client.ExecIO{Stdout: &out, Stderr: &errb})
	if err == nil && es.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", es.ExitCode, shorten(errb.String(), 200))
	}
	if err != nil {
		return st, fmt.Errorf("processes: %w", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if l != "" {
			st.Processes = append(st.Processes, l)
		}
	}
	sort.Strings(st.Processes)
	return st, nil
}

// Volatile returns the paths two fault-free runs of the same script
// disagree on (besides VolatilePatterns): their contents are not the
// script's to decide.
func Volatile(a, b State) []string {
	var out []string
	for p, va := range a.Files {
		if matchVolatile(p, VolatilePatterns) {
			continue
		}
		if vb, ok := b.Files[p]; !ok || vb != va {
			out = append(out, p)
		}
	}
	for p := range b.Files {
		if _, ok := a.Files[p]; !ok && !matchVolatile(p, VolatilePatterns) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// Diff lists how got differs from want: files (volatile ones skipped),
// sessions, processes and effects (a logical effect of wants missing,
// or received more than once). Empty: the same state.
func Diff(want, got State, volatile []string) []string {
	vol := map[string]bool{}
	for _, p := range volatile {
		vol[p] = true
	}
	skip := func(p string) bool { return vol[p] || matchVolatile(p, VolatilePatterns) }
	var d []string
	var paths []string
	for p := range want.Files {
		paths = append(paths, p)
	}
	for p := range got.Files {
		if _, ok := want.Files[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		if skip(p) {
			continue
		}
		w, wok := want.Files[p]
		g, gok := got.Files[p]
		switch {
		case !gok:
			d = append(d, "file "+p+": missing")
		case !wok:
			d = append(d, "file "+p+": extra")
		case w != g:
			d = append(d, fmt.Sprintf("file %s: %s, want %s", p, g, w))
		}
	}
	for _, s := range sortedKeys(want.Sessions, got.Sessions) {
		w, wok := want.Sessions[s]
		g, gok := got.Sessions[s]
		switch {
		case !gok:
			d = append(d, "session "+s+": missing")
		case !wok:
			d = append(d, "session "+s+": extra")
		case w != g:
			d = append(d, "session "+s+": shell state differs")
		}
	}
	if strings.Join(want.Processes, "\n") != strings.Join(got.Processes, "\n") {
		d = append(d, fmt.Sprintf("processes: %s, want %s", strings.Join(got.Processes, "; "), strings.Join(want.Processes, "; ")))
	}
	for _, e := range sortedKeys(want.Effects, got.Effects) {
		if want.Effects[e] == 0 {
			continue // not an effect of the script
		}
		switch n := got.Effects[e]; {
		case n == 0:
			d = append(d, "effect "+e+": missing")
		case n > 1:
			d = append(d, fmt.Sprintf("effect %s: received %d times", e, n))
		}
	}
	return d
}

// Duplicates counts the extra copies of effects: the sum over effects
// of count-1 where count > 1. Missing counts the expected effects never
// received.
func Duplicates(counts map[string]int, expected []string) (dups, missing int) {
	for _, n := range counts {
		if n > 1 {
			dups += n - 1
		}
	}
	for _, e := range expected {
		if counts[e] == 0 {
			missing++
		}
	}
	return dups, missing
}

func sortedKeys[V any](ms ...map[string]V) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}
