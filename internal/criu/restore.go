package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"

	"github.com/molt-sh/molt/internal/errdefs"
)

// RestoreStats are CRIU's statistics of one restore (stats-restore) and
// the time the call took.
type RestoreStats struct {
	ForkingMS       float64 // creating the tasks
	RestoreMS       float64 // the whole restore as CRIU counts it
	PagesRestored   uint64
	PagesCompared   uint64
	PagesSkippedCow uint64

	TotalMS float64 // the whole call, starting CRIU (and the lazy-pages daemon) included
}

// RestoreResult is a restored tree.
type RestoreResult struct {
	Pid   int // host PID of the restored root
	Stats RestoreStats

	// LazyDone, for a lazy restore, receives the lazy-pages daemon's end
	// (nil once every page was served) and is then closed. It is nil for
	// an eager restore.
	LazyDone <-chan error
}

// lazySocket is the socket the lazy-pages daemon listens on, in the work
// directory that it and the restore share.
const lazySocket = "lazy-pages.socket"

// Restore restores the tree dumped in o.ImagesDir.
func (t *Tool) Restore(ctx context.Context, o RestoreOptions) (RestoreResult, error) {
	var res RestoreResult
	if o.Root != "" {
		if err := CheckMounts(o.ImagesDir, o.Root); err != nil {
			return res, &Error{Op: "restore", Err: err}
		}
	}
	dirs, err := openDirs(o.ImagesDir, o.WorkDir)
	if err != nil {
		return res, &Error{Op: "restore", Err: err}
	}
	defer dirs.close()
	opts, err := o.rpcOpts(int(dirs.images.Fd()), int(dirs.work.Fd()))
	if err != nil {
		return res, &Error{Op: "restore", Err: err}
	}
	start := time.Now()

	var lazy *lazyDaemon
	if o.LazyPages {
		fs, err := t.features(ctx)
		if err != nil {
			return res, &Error{Op: "restore", Err: err}
		}
		if !fs.lazyPages {
			return res, &Error{Op: "restore", Err: fmt.Errorf("lazy pages: %s: %w", fs.lazyReason, errdefs.ErrNotSupported)}
		}
		if lazy, err = t.startLazyPages(ctx, o.ImagesDir, dirs.workPath, o.LogLevel, o.PageServer); err != nil {
			return res, err
		}
	}

	logPath := filepath.Join(dirs.workPath, restoreLog)
	req := &rpc.CriuReq{Type: rpc.CriuReqType_RESTORE.Enum(), Opts: opts}
	var resps []*rpc.CriuResp
	if o.Spare != nil {
		if len(o.Namespaces) > 0 || len(o.InheritFDs) > 0 {
			o.Spare.Kill()
			err = &Error{Op: "restore", Err: fmt.Errorf("a spare CRIU brings its own namespaces and no inherited files: %w", errdefs.ErrInvalidArgument)}
		} else if p := o.Spare.take(); p == nil {
			err = &Error{Op: "restore", Err: errSpareGone}
		} else {
			resps, err = t.session(ctx, "restore", p, []*rpc.CriuReq{req}, logPath, nil, o.Started)
		}
	} else {
		resps, err = t.call(ctx, "restore", []*rpc.CriuReq{req}, o.files(), o.Namespaces, logPath, nil, o.Started)
	}
	if err == nil && !resps[0].GetSuccess() {
		err = respError("restore", resps[0], logPath)
	}
	if err != nil {
		if lazy != nil {
			lazy.kill()
		}
		return res, err
	}
	res.Pid = int(resps[0].GetRestore().GetPid())
	took := time.Since(start)
	res.Stats, _ = ReadRestoreStats(dirs.workPath)
	res.Stats.TotalMS = ms(took)
	if lazy != nil {
		res.LazyDone = lazy.wait()
	}
	return res, nil
}

// ReadRestoreStats reads CRIU's statistics of a restore from
// dir/stats-restore (TotalMS is 0: the file does not hold it).
func ReadRestoreStats(dir string) (RestoreStats, error) {
	var st RestoreStats
	s, err := readStats(dir, statsRestore)
	if err != nil {
		return st, err
	}
	r := s.GetRestore()
	if r == nil {
		return st, fmt.Errorf("%s: no restore statistics", filepath.Join(dir, statsRestore))
	}
	st.ForkingMS = usToMS(r.GetForkingTime())
	st.RestoreMS = usToMS(r.GetRestoreTime())
	st.PagesRestored = r.GetPagesRestored()
	st.PagesCompared = r.GetPagesCompared()
	st.PagesSkippedCow = r.GetPagesSkippedCow()
	return st, nil
}

// lazyDaemon is a running `criu lazy-pages`.
type lazyDaemon struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when cmd.Wait returned
	err     error         // cmd.Wait's result, set before exited is closed
}

// startLazyPages starts CRIU's lazy-pages daemon for imagesDir and returns
// once it listens on its socket in workDir. The daemon is not bound to
// ctx once started: the restored tree needs it until every page is in.
func (t *Tool) startLazyPages(ctx context.Context, imagesDir, workDir string, level int, ps *os.File) (*lazyDaemon, error) {
	if level == 0 {
		level = DefaultLogLevel
	}
	sock := filepath.Join(workDir, lazySocket)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, &Error{Op: "lazy-pages", Err: err}
	}
	t.ensureKdatLink()
	start := time.Now()
	d := &lazyDaemon{logPath: filepath.Join(workDir, lazyLog), exited: make(chan struct{})}
	d.cmd = exec.Command(t.path, "lazy-pages",
		"--images-dir", imagesDir, "--work-dir", workDir,
		"--log-file", lazyLog, "-v"+strconv.Itoa(level))
	if ps != nil {
		// The socket is the daemon's descriptor 3.
		d.cmd.Args = append(d.cmd.Args, "--page-server", "--ps-socket", "3")
		d.cmd.ExtraFiles = []*os.File{ps}
	}
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return nil, &Error{Op: "lazy-pages", Err: fmt.Errorf("start %s: %w", t.path, err)}
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	for step := 100 * time.Microsecond; ; step = min(2*step, 5*time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return d, nil
		}
		select {
		case <-d.exited:
			return nil, &Error{Op: "lazy-pages", Cause: logCause(d.logPath), Log: existing(d.logPath),
				Err: fmt.Errorf("exited before listening: %v", d.err)}
		case <-ctx.Done():
			d.kill()
			return nil, t.timeoutError(ctx, "lazy-pages", time.Since(start), d.cmd.Process.Pid, d.logPath)
		case <-time.After(step):
		}
	}
}

// kill stops the daemon and waits for it.
func (d *lazyDaemon) kill() {
	syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
}

// wait returns a channel that receives the daemon's end.
func (d *lazyDaemon) wait() <-chan error {
	ch := make(chan error, 1)
	go func() {
		<-d.exited
		if d.err != nil {
			ch <- &Error{Op: "lazy-pages", Cause: logCause(d.logPath), Log: existing(d.logPath), Err: d.err}
		} else {
			ch <- nil
		}
		close(ch)
	}()
	return ch
}
