package core

import (
	"context"
	"sort"
	"time"

	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/remote"
)

// indexImages has the store index, in the background, the images this
// host has (the newest, as many as the store keeps indexed) and those it
// makes later (queueIndex), as a fetch of a tree over one would on
// first use: the first resume from the store on this daemon, a
// migration's target among them, then does not build it in its
// downtime (about 0.35 s for the Debian test image with its files in
// the page cache). The index is keyed by the image subvolume's UUID, as
// treeBase's snapshot names it. The manager's close ends it.
func (m *Manager) indexImages() {
	if m.store == nil || m.opts.noTreeBase {
		return
	}
	m.indexQ = make(chan string, remote.MaxBases)
	if imgs, err := meta.List[meta.Image](m.db, meta.Images); err == nil {
		sort.Slice(imgs, func(i, j int) bool { return imgs[i].Created.After(imgs[j].Created) })
		for _, img := range imgs[:min(len(imgs), remote.MaxBases)] {
			m.queueIndex(img.Name)
		}
	}
	m.goStoreWorker(func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				return
			case name := <-m.indexQ:
				m.indexImage(ctx, name)
			}
		}
	})
}

// queueIndex queues image name for indexImages (dropped when the queue
// is full: the first resume over it indexes it).
func (m *Manager) queueIndex(name string) {
	if m.indexQ == nil {
		return
	}
	select {
	case m.indexQ <- name:
	default:
	}
}

func (m *Manager) indexImage(ctx context.Context, name string) {
	dir := m.imageDir(name)
	if validName("image", name) != nil {
		return
	}
	if ro, err := fsnap.Readonly(dir); err != nil || !ro {
		return
	}
	key, err := fsnap.SubvolumeUUID(dir)
	if err != nil {
		return
	}
	start := time.Now()
	if err := m.store.IndexBase(ctx, remote.Base{Dir: dir, Key: key}); err != nil {
		m.log.Debug("store: image not indexed ahead", "image", name, "err", err)
		return
	}
	m.log.Debug("store: image indexed ahead", "image", name, "took", time.Since(start))
}
