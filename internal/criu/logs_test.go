package criu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/rpc"

	"github.com/molt-sh/molt/internal/errdefs"
)

func TestLogError(t *testing.T) {
	for _, tc := range []struct{ name, log, want string }{
		{
			name: "go mptcp",
			log: `(00.045316) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.049000) inet: Dumping inet socket at 5
(00.049278) Error (criu/sk-inet.c:137): inet: Unsupported proto 262 for socket 1b6b5
(00.049280) Error (criu/sk-inet.c:139): inet: For Go programs, consider using "GODEBUG=multipathtcp=0" to disable MPTCP
(00.049295) Error (criu/cr-dump.c:1545): Dump files (pid: 10636) failed with -1
(00.049613) Error (criu/cr-dump.c:1975): Dumping FAILED.
`,
			want: `Error (criu/sk-inet.c:137): inet: Unsupported proto 262 for socket 1b6b5; inet: For Go programs, consider using "GODEBUG=multipathtcp=0" to disable MPTCP`,
		},
		{
			name: "program output",
			log: `(00.039872) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.039889) 	Running iptables [iptables  -t filter -I INPUT ...]
sh: 1: iptables: not found
(00.041401) Error (criu/util.c:657): exited, status=127
(00.041500) Error (criu/cr-dump.c:1975): Dumping FAILED.
`,
			want: `Error (criu/util.c:657): exited, status=127 [sh: 1: iptables: not found]`,
		},
		{
			name: "network lock without iptables",
			log: `(00.01) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
Error (criu/util.c:642): execvp("iptables-restore", ...) failed: No such file or directory
(00.046448) Error (criu/util.c:657): exited, status=1
(00.047178) Error (criu/net.c:3436): net: Locking network failed: iptables-restore returned -1.
(00.05) Error (criu/cr-dump.c:1975): Dumping FAILED.
`,
			want: `Error (criu/util.c:642): execvp("iptables-restore", ...) failed: No such file or directory; exited, status=1`,
		},
		{
			name: "iptables-save probes are noise",
			log: `Error (criu/util.c:642): execvp("iptables-save", ...) failed: No such file or directory
(00.049243) Error (criu/util.c:1723): iptables-save -V failed
Error (criu/util.c:642): execvp("ip6tables-legacy-save", ...) failed: No such file or directory
(00.051621) Error (criu/util.c:1723): ip6tables-legacy-save -V failed
(00.06) Error (criu/files-reg.c:2000): Can't lookup mount=123 for fd=4 path=/x
(00.07) Error (criu/cr-dump.c:1975): Dumping FAILED.
`,
			want: `Error (criu/files-reg.c:2000): Can't lookup mount=123 for fd=4 path=/x`,
		},
		{
			name: "only the summary",
			log: `(00.1) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.2) Error (criu/cr-restore.c:2331): Restoring FAILED.
`,
			want: `Error (criu/cr-restore.c:2331): Restoring FAILED.`,
		},
		{
			name: "only noise",
			log:  "(00.1) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "dump.log")
			if err := os.WriteFile(log, []byte(tc.log), 0o600); err != nil {
				t.Fatal(err)
			}
			want := ""
			if tc.want != "" {
				want = tc.want + " (log " + log + ")"
			}
			if got := LogError(dir); got != want {
				t.Errorf("LogError:\n got %q\nwant %q", got, want)
			}
		})
	}
	if got := LogError(t.TempDir()); got != "" {
		t.Errorf("LogError of a directory without logs = %q", got)
	}
}

func TestLastLogLine(t *testing.T) {
	log := filepath.Join(t.TempDir(), "dump.log")
	os.WriteFile(log, []byte("(00.1) one\n(00.2) Seizing 123\n\n"), 0o600)
	if got := lastLogLine(log); got != "Seizing 123" {
		t.Errorf("lastLogLine = %q", got)
	}
}

func TestOptions(t *testing.T) {
	o := DumpOptions{Pid: 42, LeaveRunning: true, External: []string{"mnt[/x]:x"}, CgroupMode: "full", NetworkLock: "nftables"}
	opts, err := o.rpcOpts(7, 8)
	if err != nil {
		t.Fatal(err)
	}
	if opts.GetPid() != 42 || opts.GetImagesDirFd() != 7 || opts.GetWorkDirFd() != 8 || !opts.GetLeaveRunning() ||
		opts.GetLogLevel() != DefaultLogLevel || opts.GetLogFile() != "dump.log" || !opts.GetManageCgroups() ||
		opts.GetManageCgroupsMode() != rpc.CriuCgMode_FULL || opts.GetNetworkLock() != rpc.CriuNetworkLockMethod_NFTABLES ||
		len(opts.GetExternal()) != 1 || opts.FreezeCgroup != nil || opts.GhostLimit != nil {
		t.Errorf("dump options %v", opts)
	}

	r := RestoreOptions{RstSibling: true, InheritFDs: []InheritFD{{"a", os.Stdin}, {"b", os.Stdout}}, CgroupRoot: "/molt", CgroupRoots: []CgroupRoot{{"memory", "/molt/x"}}}
	ropts, err := r.rpcOpts(7, 8)
	if err != nil {
		t.Fatal(err)
	}
	if !ropts.GetRstSibling() || ropts.GetLogFile() != "restore.log" || len(ropts.InheritFd) != 2 ||
		ropts.InheritFd[0].GetFd() != 4 || ropts.InheritFd[1].GetFd() != 5 || ropts.InheritFd[1].GetKey() != "b" ||
		len(ropts.CgRoot) != 2 || ropts.CgRoot[0].Ctrl != nil || ropts.CgRoot[0].GetPath() != "/molt" ||
		ropts.CgRoot[1].GetCtrl() != "memory" || ropts.ManageCgroups != nil {
		t.Errorf("restore options %v", ropts)
	}
	if fs := r.files(); len(fs) != 2 || fs[0] != os.Stdin {
		t.Errorf("inherited files %v", fs)
	}

	for _, bad := range []DumpOptions{{}, {Pid: 1, CgroupMode: "hard"}, {Pid: 1, NetworkLock: "pf"}, {Pid: 1, LogLevel: 5}} {
		if _, err := bad.rpcOpts(7, 8); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%+v: error %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, err := (&RestoreOptions{InheritFDs: []InheritFD{{Key: "x"}}}).rpcOpts(7, 8); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("inherit fd without a file: error %v", err)
	}
}

func TestMissingDirs(t *testing.T) {
	tool := New("/nonexistent/criu")
	if _, err := tool.Dump(context.Background(), DumpOptions{Pid: 1, ImagesDir: "/nonexistent"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("dump into a missing directory: %v", err)
	}
	if _, err := tool.Restore(context.Background(), RestoreOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("restore without images: %v", err)
	}
}

// TestProbeMissing: a missing binary is reported, not a panic, and
// memoized like any finished probe.
func TestProbeMissing(t *testing.T) {
	tool := New("/nonexistent/criu")
	f := tool.Probe(context.Background())
	if f.Version != "" || f.Check || f.SelfTest == nil || f.CheckOutput == "" {
		t.Errorf("probe of a missing criu: %+v", f)
	}
	if g := tool.Probe(context.Background()); g != f {
		t.Errorf("second probe %+v differs from %+v", g, f)
	}
}
