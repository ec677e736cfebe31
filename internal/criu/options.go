package criu

import (
	"fmt"
	"os"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
)

// DefaultLogLevel is CRIU's log level when an option leaves it 0: 4 is
// debug, which the statistics and the failure causes need.
const DefaultLogLevel = 4

// DumpOptions describe one dump. They map one to one to CRIU's options
// of the same names.
type DumpOptions struct {
	Pid       int    // root of the tree to dump (host PID)
	ImagesDir string // existing directory for the images
	WorkDir   string // dump.log and stats-dump; "" means ImagesDir

	LeaveRunning    bool // resume the tree after the dump instead of killing it
	TCPEstablished  bool // dump established TCP connections (they stay locked until the tree is killed or restored)
	TCPClose        bool // neither lock nor dump the state of established TCP connections (restored closed)
	TCPSkipInFlight bool // skip connections still in the handshake instead of failing
	FileLocks       bool
	ExtUnixSk       bool // allow unix sockets whose peer is outside the tree
	ShellJob        bool // the tree's session or process group leader is outside it
	LinkRemap       bool // allow open, unlinked files to be linked back for the dump

	// External lists --external entries, e.g. "mnt[/path]:name" or
	// "net[4026531840]:extNetNs".
	External []string

	// Namespaces are network, UTS or IPC namespaces CRIU runs in. A tree
	// that lives in them shares CRIU's, so CRIU leaves them out of the
	// images: no fork per namespace to dump it and, for a network
	// namespace, no scan of the host's connection-tracking table, which
	// CRIU does even for an external one. Restore such images with
	// RestoreOptions.Namespaces.
	Namespaces []ns.Ref

	// Spare, if set, is the started CRIU the dump runs on (StartSpareIn,
	// in the namespaces the dump needs; Namespaces must be unset). It is
	// used up even if the dump fails.
	Spare *Spare

	// FreezeCgroup is a freezer cgroup directory that holds exactly the
	// tree (v1 freezer, or a cgroup2 directory); CRIU freezes through it
	// instead of with ptrace. CRIU polls the freezer in 100 ms steps (on
	// v1 and v2 alike: freezing took ~100 ms vs 0.2 ms with ptrace), unless
	// the group is frozen already: freeze it first (cgroup2, ~1 ms). CRIU
	// leaves the group as it found it, so a group frozen before a
	// LeaveRunning dump is still frozen after it.
	FreezeCgroup string
	// ManageCgroups makes CRIU dump the tree's cgroups; CgroupMode picks
	// how ("soft", "full", "strict", "ignore", "props", "none"; "" is
	// CRIU's default, soft).
	ManageCgroups bool
	CgroupMode    string

	// NetworkLock is how TCP connections are locked during the dump:
	// "iptables" (CRIU's default, which runs the iptables program),
	// "nftables" (through CRIU's libnftables, no program needed) or
	// "skip" (the caller isolates the network itself).
	NetworkLock string

	GhostLimit uint32 // largest deleted file kept in the images, bytes; 0 is CRIU's default (1 MiB)
	LogLevel   int    // 0 means DefaultLogLevel

	// PreDump, if set, runs when CRIU is ready to dump and before it
	// stops the tree (CRIU's pre-dump notification): a caller freezing
	// the tree through FreezeCgroup itself can do it here, so that CRIU's
	// start-up is outside the frozen window. An error aborts the dump.
	PreDump func() error
	// PostDump, if set, runs when the images are complete and the tree is
	// still stopped (CRIU's post-dump notification), before CRIU resumes
	// the tree (LeaveRunning) or kills it: the moment to snapshot the
	// tree's filesystem. An error fails the dump (the tree is resumed) and
	// Dump returns it wrapped.
	PostDump func() error

	// Stream, if set, receives the images instead of ImagesDir (CRIU's
	// --stream); it must listen in ImagesDir (Listen). Its WriteTo
	// writes them there after the dump.
	Stream *Stream
}

// InheritFD hands an open file to the restored tree in place of the
// resource that was dumped as external with Key ("--inherit-fd fd[N]:Key").
type InheritFD struct {
	Key  string
	File *os.File
}

// CgroupRoot maps the root of one controller's hierarchy ("" for all) to
// Path on restore (--cgroup-root).
type CgroupRoot struct {
	Controller string
	Path       string
}

// RestoreOptions describe one restore.
type RestoreOptions struct {
	ImagesDir string
	WorkDir   string // restore.log, lazy-pages.log and stats-restore; "" means ImagesDir
	Root      string // --root: where the tree's root mount is; needed for a tree in its own mount namespace

	// RstSibling restores the tree's root as a child of the calling
	// process (a sibling of CRIU), which must then reap it. Without it the
	// root is CRIU's child and is reparented to the nearest subreaper (or
	// init) when CRIU exits.
	RstSibling bool

	// LeaveStopped leaves every restored task stopped (SIGSTOP) instead
	// of running: a pre-restored standby that starts with SIGCONT.
	LeaveStopped bool

	External   []string
	InheritFDs []InheritFD

	// Namespaces are the namespaces CRIU runs in: a tree whose images
	// leave namespaces out (DumpOptions.Namespaces) joins CRIU's. A
	// cgroup namespace here is the restored tree's with CgroupMode
	// "ignore" (CRIU then makes none).
	Namespaces []ns.Ref

	// Spare, if set, is the started CRIU the restore runs on (in the
	// spare's own new namespaces; Namespaces and InheritFDs must be
	// unset). It is used up even if the restore fails.
	Spare *Spare

	TCPEstablished bool
	TCPClose       bool
	FileLocks      bool
	ExtUnixSk      bool
	ShellJob       bool

	// LazyPages restores memory on demand through CRIU's lazy-pages
	// daemon (userfaultfd): Restore returns before the memory is in place.
	// ErrNotSupported where userfaultfd's non-cooperative mode is missing.
	LazyPages bool
	// PageServer, with LazyPages, is a connected stream socket the
	// lazy-pages daemon asks for the lazy pages (ServePages answers on
	// its other end), instead of reading them from ImagesDir: the
	// restore itself still reads the pages that are not lazy there.
	PageServer *os.File

	ManageCgroups bool
	CgroupMode    string
	// Started, if set, is called with CRIU's PID once it runs and before
	// it restores anything: the restored tree is forked by CRIU, so a
	// caller that moves CRIU into a cgroup here (with CgroupMode "ignore")
	// gets the whole tree in that cgroup, in every hierarchy.
	Started func(pid int) error

	// CgroupRoot moves the tree's cgroups under this path in every
	// controller (--cgroup-root PATH); CgroupRoots does so per controller.
	CgroupRoot  string
	CgroupRoots []CgroupRoot

	NetworkLock string
	LogLevel    int // 0 means DefaultLogLevel
}

var cgroupModes = map[string]rpc.CriuCgMode{
	"ignore": rpc.CriuCgMode_IGNORE,
	"none":   rpc.CriuCgMode_CG_NONE,
	"props":  rpc.CriuCgMode_PROPS,
	"soft":   rpc.CriuCgMode_SOFT,
	"full":   rpc.CriuCgMode_FULL,
	"strict": rpc.CriuCgMode_STRICT,
}

var networkLocks = map[string]rpc.CriuNetworkLockMethod{
	"iptables": rpc.CriuNetworkLockMethod_IPTABLES,
	"nftables": rpc.CriuNetworkLockMethod_NFTABLES,
	"skip":     rpc.CriuNetworkLockMethod_SKIP,
}

// common fills the options that dump and restore share.
func common(opts *rpc.CriuOpts, logFile string, logLevel int, manage bool, mode, lock string) error {
	if logLevel == 0 {
		logLevel = DefaultLogLevel
	}
	if logLevel < 0 || logLevel > 4 {
		return fmt.Errorf("log level %d not in 0..4: %w", logLevel, errdefs.ErrInvalidArgument)
	}
	opts.LogLevel = proto.Int32(int32(logLevel))
	opts.LogFile = proto.String(logFile)
	if manage || mode != "" {
		opts.ManageCgroups = proto.Bool(true)
	}
	if mode != "" {
		m, ok := cgroupModes[mode]
		if !ok {
			return fmt.Errorf("cgroup mode %q: %w", mode, errdefs.ErrInvalidArgument)
		}
		opts.ManageCgroupsMode = m.Enum()
	}
	if lock != "" {
		l, ok := networkLocks[lock]
		if !ok {
			return fmt.Errorf("network lock %q: %w", lock, errdefs.ErrInvalidArgument)
		}
		opts.NetworkLock = l.Enum()
	}
	return nil
}

// rpcOpts returns CRIU's options for o, with the images and work
// directories given as descriptors of this process.
func (o *DumpOptions) rpcOpts(imagesFd, workFd int) (*rpc.CriuOpts, error) {
	if o.Pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", o.Pid, errdefs.ErrInvalidArgument)
	}
	opts := &rpc.CriuOpts{
		ImagesDirFd:     proto.Int32(int32(imagesFd)),
		WorkDirFd:       proto.Int32(int32(workFd)),
		Pid:             proto.Int32(int32(o.Pid)),
		LeaveRunning:    proto.Bool(o.LeaveRunning),
		TcpEstablished:  proto.Bool(o.TCPEstablished),
		TcpClose:        proto.Bool(o.TCPClose),
		TcpSkipInFlight: proto.Bool(o.TCPSkipInFlight),
		FileLocks:       proto.Bool(o.FileLocks),
		ExtUnixSk:       proto.Bool(o.ExtUnixSk),
		ShellJob:        proto.Bool(o.ShellJob),
		LinkRemap:       proto.Bool(o.LinkRemap),
		External:        o.External,
	}
	if o.FreezeCgroup != "" {
		opts.FreezeCgroup = proto.String(o.FreezeCgroup)
	}
	if o.GhostLimit != 0 {
		opts.GhostLimit = proto.Uint32(o.GhostLimit)
	}
	if err := common(opts, dumpLog, o.LogLevel, o.ManageCgroups, o.CgroupMode, o.NetworkLock); err != nil {
		return nil, err
	}
	return opts, nil
}

// rpcOpts returns CRIU's options for o. Inherited files are CRIU's
// descriptors 4, 5, ... in the order of o.InheritFDs.
func (o *RestoreOptions) rpcOpts(imagesFd, workFd int) (*rpc.CriuOpts, error) {
	opts := &rpc.CriuOpts{
		ImagesDirFd:    proto.Int32(int32(imagesFd)),
		WorkDirFd:      proto.Int32(int32(workFd)),
		RstSibling:     proto.Bool(o.RstSibling),
		LeaveStopped:   proto.Bool(o.LeaveStopped),
		TcpEstablished: proto.Bool(o.TCPEstablished),
		TcpClose:       proto.Bool(o.TCPClose),
		FileLocks:      proto.Bool(o.FileLocks),
		ExtUnixSk:      proto.Bool(o.ExtUnixSk),
		ShellJob:       proto.Bool(o.ShellJob),
		LazyPages:      proto.Bool(o.LazyPages),
		External:       o.External,
	}
	if o.Root != "" {
		opts.Root = proto.String(o.Root)
	}
	for i, in := range o.InheritFDs {
		if in.Key == "" || in.File == nil {
			return nil, fmt.Errorf("inherit fd %d: key and file are required: %w", i, errdefs.ErrInvalidArgument)
		}
		opts.InheritFd = append(opts.InheritFd, &rpc.InheritFd{
			Key: proto.String(in.Key),
			Fd:  proto.Int32(int32(4 + i)),
		})
	}
	if o.CgroupRoot != "" {
		opts.CgRoot = append(opts.CgRoot, &rpc.CgroupRoot{Path: proto.String(o.CgroupRoot)})
	}
	for _, r := range o.CgroupRoots {
		cr := &rpc.CgroupRoot{Path: proto.String(r.Path)}
		if r.Controller != "" {
			cr.Ctrl = proto.String(r.Controller)
		}
		opts.CgRoot = append(opts.CgRoot, cr)
	}
	if err := common(opts, restoreLog, o.LogLevel, o.ManageCgroups, o.CgroupMode, o.NetworkLock); err != nil {
		return nil, err
	}
	return opts, nil
}

func (o *RestoreOptions) files() []*os.File {
	fs := make([]*os.File, len(o.InheritFDs))
	for i, in := range o.InheritFDs {
		fs[i] = in.File
	}
	return fs
}
