package core

// Lazy resume from the local pool: a hibernated sandbox whose pages are
// here resumes as one from the store does (lazy.go), its tree running
// before its memory is in, the pages served from the checkpoint's own
// page images. A resume then costs about the same at any memory size,
// where restoring every page first grows with it. The fetch's machinery
// is the store's, with every block present from the start: the same
// page server, the same kill of the tree before the lazy-pages daemon
// is let go should serving fail, the same marker for a daemon that
// stops meanwhile (endLazyFetch).

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/remote"
	"github.com/molt-sh/molt/internal/revert"
)

// startLocalLazy prepares the lazy resume of local checkpoint ck: nil
// (resume eagerly) if it cannot be lazy or holds less than lazyMinBytes
// of page images.
func (m *Manager) startLocalLazy(ctx context.Context, ck checkpointRec) (*lazyFetch, error) {
	if why := m.lazyResumable(ck); why != "" || ck.Offloaded || ck.IDs.Enabled() {
		return nil, nil
	}
	var pages []ckstore.Object
	var bytes int64
	for _, o := range ck.Objects {
		name, ok := strings.CutPrefix(o.Path, ckstore.ImagesDir+"/")
		if ok && strings.HasPrefix(name, "pages-") && o.Size >= lazyBlock && o.Size%criu.PageSize == 0 {
			pages = append(pages, o)
			bytes += o.Size
		}
	}
	if bytes < lazyMinBytes {
		return nil, nil
	}
	m.touch(ck.ID)
	lf := &lazyFetch{m: m, ck: ck, images: map[string]*lazyImage{}, start: time.Now(), local: true}
	rv := revert.Logged(m.log, "local lazy resume")
	defer rv.Fail()
	rv.Add(lf.closeFiles)
	dir := m.ckDir(ck.ID)
	for _, o := range pages {
		fd, err := unix.Open(filepath.Join(dir, o.Path), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		blocks := int((o.Size + lazyBlock - 1) / lazyBlock)
		li := &lazyImage{name: strings.TrimPrefix(o.Path, ckstore.ImagesDir+"/"), obj: remote.Object{Name: o.Path, Size: o.Size},
			f: os.NewFile(uintptr(fd), o.Path), have: make([]bool, blocks), wait: map[int]chan struct{}{}}
		for b := range li.have {
			li.have[b] = true
		}
		lf.images[li.name] = li
	}
	var err error
	if lf.pm, err = criu.ReadPageMap(m.cks.Images(ck.ID)); err != nil {
		return nil, err
	}
	lf.ctx, lf.cancel = context.WithCancel(context.WithoutCancel(ctx))
	rv.Add(func() error { lf.cancel(); return nil })
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	lf.ours, lf.theirs = os.NewFile(uintptr(fds[0]), "page server"), os.NewFile(uintptr(fds[1]), "lazy pages")
	lf.served, lf.finished = make(chan struct{}), make(chan struct{})
	if err := m.register(lf); err != nil {
		lf.ours.Close()
		lf.theirs.Close()
		return nil, err
	}
	rv.Success()
	go lf.serve()
	return lf, nil
}

// fillLocal ends a local lazy resume once CRIU's lazy-pages daemon has
// every page (or serving failed, and the tree was killed).
func (lf *lazyFetch) fillLocal() {
	<-lf.served
	err := lf.failed()
	lf.mu.Lock()
	lf.ended = true
	lf.mu.Unlock()
	m := lf.m
	if err != nil {
		m.metrics.localLazy.WithLabelValues("failed").Inc()
	} else {
		m.log.Info("lazy resume: every page is in", "checkpoint", lf.ck.ID, "sandbox", lf.ck.Sandbox,
			"asked_bytes", lf.asked.Load(), "took", time.Since(lf.start).Round(time.Millisecond))
		m.metrics.localLazy.WithLabelValues("ok").Inc()
	}
	lf.closeFiles()
	lf.done()
}
