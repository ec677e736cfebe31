package criu

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Log files CRIU writes into the work directory, one per kind of call.
const (
	dumpLog    = "dump.log"
	restoreLog = "restore.log"
	lazyLog    = "lazy-pages.log"
)

// rlimitNoise marks the error that every CRIU log has on hosts without
// CAP_SYS_RESOURCE; it never is the cause of a failure.
const rlimitNoise = "Can't setup RLIMIT_NOFILE"

// isNoise reports errors that CRIU logs and then goes on: the
// RLIMIT_NOFILE one, and the probes for iptables-save programs that are not
// installed (dumping a network namespace; CRIU then skips the iptables
// dump).
func isNoise(line string) bool {
	if strings.Contains(line, rlimitNoise) {
		return true
	}
	return strings.Contains(line, "tables") &&
		(strings.Contains(line, `-save -V failed`) || strings.Contains(line, `-save", ...) failed`))
}

// LogError returns the real cause of a failure from the newest CRIU log
// (*.log) in workDir, followed by the log's path: the first "Error (" line
// that is not noise (the RLIMIT_NOFILE error that every log has on hosts
// without CAP_SYS_RESOURCE, probes for missing iptables-save programs),
// with the error lines from the same source file that follow it. It
// returns "" when no log holds such an error.
func LogError(workDir string) string {
	logs, _ := filepath.Glob(filepath.Join(workDir, "*.log"))
	var newest string
	var mtime int64
	for _, l := range logs {
		st, err := os.Stat(l)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if m := st.ModTime().UnixNano(); newest == "" || m > mtime {
			newest, mtime = l, m
		}
	}
	cause := logCause(newest)
	if cause == "" {
		return ""
	}
	return cause + " (log " + newest + ")"
}

// logCause returns the cause of a failure recorded in CRIU's log at path,
// or "" (see LogError).
func logCause(path string) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	type logErr struct{ src, text string }
	var errs []logErr
	// Lines without CRIU's "(seconds) " prefix are the output of programs
	// CRIU ran (iptables, tar, ...): keep the last few for the error that
	// follows them ("exited, status=127").
	var output []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		// A child that CRIU forked logs its errors without the prefix.
		i := strings.Index(line, "Error (")
		if i != 0 && !strings.HasPrefix(line, "(") {
			if l := strings.TrimSpace(line); l != "" {
				output = append(output, l)
				if len(output) > 3 {
					output = output[1:]
				}
			}
			continue
		}
		if i < 0 || isNoise(line) {
			output = nil
			continue
		}
		text := line[i:]
		if len(output) > 0 {
			text += " [" + strings.Join(output, "; ") + "]"
			output = nil
		}
		src := text[len("Error ("):]
		if j := strings.IndexAny(src, ":)"); j >= 0 {
			src = src[:j]
		}
		errs = append(errs, logErr{src, text})
	}
	// "Dumping FAILED." and its kind only summarize; prefer anything else.
	first := -1
	for i, e := range errs {
		if !strings.Contains(e.text, "FAILED.") {
			first = i
			break
		}
	}
	if first < 0 {
		if len(errs) == 0 {
			return ""
		}
		first = 0
	}
	cause := errs[first].text
	for _, e := range errs[first+1:] {
		if e.src != errs[first].src || len(cause) > 1000 {
			break
		}
		cause += "; " + stripErrorPrefix(e.text)
	}
	return cause
}

// stripErrorPrefix turns "Error (criu/x.c:12): msg" into "msg".
func stripErrorPrefix(s string) string {
	if i := strings.Index(s, "): "); i >= 0 {
		return s[i+3:]
	}
	return s
}

// lastLogLine returns the last non-empty line of the log at path, without
// its timestamp, or "".
func lastLogLine(path string) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const tail = 4096
	if st, err := f.Stat(); err == nil && st.Size() > tail {
		f.Seek(st.Size()-tail, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, tail))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if strings.HasPrefix(last, "(") {
		if i := strings.Index(last, ") "); i >= 0 {
			last = last[i+2:]
		}
	}
	return last
}

// existing returns path if a file is there, else "".
func existing(path string) string {
	if path == "" {
		return ""
	}
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return path
}
