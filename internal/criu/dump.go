package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
)

// DumpStats are CRIU's statistics of one dump (stats-dump) and the time
// the call took.
type DumpStats struct {
	FreezingMS float64 // freezing the tree
	FrozenMS   float64 // the tree stayed frozen
	MemdumpMS  float64 // collecting memory into pipes
	MemwriteMS float64 // writing memory to the images

	PagesScanned       uint64
	PagesWritten       uint64
	PagesSkippedParent uint64
	PagesLazy          uint64

	TotalMS float64 // the whole call, starting CRIU included
}

// Dump checkpoints the process tree rooted at o.Pid into o.ImagesDir.
// Unless o.LeaveRunning, CRIU kills the tree after a successful dump; the
// caller still has to reap the processes that are its children.
func (t *Tool) Dump(ctx context.Context, o DumpOptions) (DumpStats, error) {
	var st DumpStats
	dirs, err := openDirs(o.ImagesDir, o.WorkDir)
	if err != nil {
		return st, &Error{Op: "dump", Err: err}
	}
	defer dirs.close()
	if o.Stream != nil {
		if o.Stream.dir != o.ImagesDir {
			return st, &Error{Op: "dump", Err: fmt.Errorf("the stream listens in %s, not in the images directory %s: %w", o.Stream.dir, o.ImagesDir, errdefs.ErrInvalidArgument)}
		}
		start := time.Now()
		if err := t.dumpCLI(ctx, o, dirs); err != nil {
			return st, err
		}
		return dumpStats(dirs.workPath, start), nil
	}
	opts, err := o.rpcOpts(int(dirs.images.Fd()), int(dirs.work.Fd()))
	if err != nil {
		return st, &Error{Op: "dump", Err: err}
	}
	logPath := filepath.Join(dirs.workPath, dumpLog)
	start := time.Now()
	var notify func(string) error
	if o.PreDump != nil || o.PostDump != nil {
		opts.NotifyScripts = proto.Bool(true)
		notify = func(script string) error {
			switch {
			case script == "pre-dump" && o.PreDump != nil:
				return o.PreDump()
			case script == "post-dump" && o.PostDump != nil:
				return o.PostDump()
			}
			return nil
		}
	}
	reqs := []*rpc.CriuReq{{Type: rpc.CriuReqType_DUMP.Enum(), Opts: opts}}
	var resps []*rpc.CriuResp
	if o.Spare != nil {
		if len(o.Namespaces) > 0 {
			o.Spare.Kill()
			return st, &Error{Op: "dump", Err: fmt.Errorf("a spare CRIU runs in its own namespaces: %w", errdefs.ErrInvalidArgument)}
		}
		p := o.Spare.take()
		if p == nil {
			return st, &Error{Op: "dump", Err: errSpareGone}
		}
		resps, err = t.session(ctx, "dump", p, reqs, logPath, notify, nil)
	} else {
		resps, err = t.call(ctx, "dump", reqs, nil, o.Namespaces, logPath, notify, nil)
	}
	if err != nil {
		return st, err
	}
	if !resps[0].GetSuccess() {
		e := respError("dump", resps[0], logPath)
		if unix.Kill(o.Pid, 0) == unix.ESRCH {
			e.Err = fmt.Errorf("pid %d: %w: %w", o.Pid, errdefs.ErrNotFound, e.Err)
		}
		return st, e
	}
	return dumpStats(dirs.workPath, start), nil
}

// dumpStats reads a finished dump's statistics from its work directory,
// with the time since start as the whole call.
func dumpStats(work string, start time.Time) DumpStats {
	took := time.Since(start)
	st, _ := ReadDumpStats(work)
	st.TotalMS = ms(took)
	return st
}

// ReadDumpStats reads CRIU's statistics of a dump from dir/stats-dump
// (TotalMS is 0: the file does not hold it).
func ReadDumpStats(dir string) (DumpStats, error) {
	var st DumpStats
	s, err := readStats(dir, statsDump)
	if err != nil {
		return st, err
	}
	d := s.GetDump()
	if d == nil {
		return st, fmt.Errorf("%s: no dump statistics", filepath.Join(dir, statsDump))
	}
	st.FreezingMS = usToMS(d.GetFreezingTime())
	st.FrozenMS = usToMS(d.GetFrozenTime())
	st.MemdumpMS = usToMS(d.GetMemdumpTime())
	st.MemwriteMS = usToMS(d.GetMemwriteTime())
	st.PagesScanned = d.GetPagesScanned()
	st.PagesWritten = d.GetPagesWritten()
	st.PagesSkippedParent = d.GetPagesSkippedParent()
	st.PagesLazy = d.GetPagesLazy()
	return st, nil
}

// dirs are the images and work directories of one call, open for CRIU.
type dirs struct {
	images, work *os.File
	workPath     string
}

func openDirs(images, work string) (*dirs, error) {
	if images == "" {
		return nil, fmt.Errorf("no images directory: %w", errdefs.ErrInvalidArgument)
	}
	if work == "" {
		work = images
	}
	d := &dirs{workPath: work}
	var err error
	if d.images, err = openDir(images); err != nil {
		return nil, err
	}
	if d.work, err = openDir(work); err != nil {
		d.images.Close()
		return nil, err
	}
	return d, nil
}

func (d *dirs) close() {
	d.images.Close()
	d.work.Close()
}

func openDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		err = &os.PathError{Op: "open", Path: path, Err: err}
		if errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
		}
		if errors.Is(err, syscall.ENOTDIR) {
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func usToMS(us uint32) float64 { return float64(us) / 1000 }
