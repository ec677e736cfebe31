package core

import (
	"context"
	"errors"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/procmem"
	"github.com/molt-sh/molt/internal/progress"
	"github.com/molt-sh/molt/internal/remote"
)

// Pre-copy, by content. A migration's final checkpoint is uploaded while
// the sandbox is frozen; what the store lacks of its pages is most of
// that upload when the sandbox has no recent full checkpoint there
// (11.6 s for a 1 GiB process with none, against 0.8 s with one). So
// before freezing, the migration reads its processes' own pages while
// they run (internal/procmem: what a dump would write) and sends the
// store those it lacks. Pre-copy without dirty-page tracking (this
// kernel has no soft-dirty bits): a page changed after it was read has
// new content, which the final upload finds unknown and sends, so
// nothing needs tracking and nothing stale can be named. The cost is a
// read and a hash of the memory while the sandbox runs, and the upload
// of pages that change before the freeze (sent twice).

// precopyBlock is what is read of a process at once.
const precopyBlock = 4 << 20

// A pre-copy gets precopyBase plus a second per precopyRate bytes of
// the sandbox's memory: at 1 GiB, 51 s where it takes about 10. What a
// process maps without touching costs a scan of its page table entries,
// so a hostile one could make the scan long; the budget bounds what it
// costs the migration.
const (
	precopyBase = 30 * time.Second
	precopyRate = 50 << 20
)

// precopy sends the store the pages of sandbox rec's processes that it
// lacks, while the sandbox runs. A failure costs only the pre-copy: it
// is logged, and the migration goes on.
func (m *Manager) precopy(ctx context.Context, rec sandboxRec) (sent int64, took time.Duration) {
	if m.opts.noPrecopy {
		return 0, 0
	}
	start := time.Now()
	progress.Report(ctx, progress.Step{Message: "sending the sandbox's memory ahead"})
	st, pages, err := m.sendPages(ctx, rec)
	took = time.Since(start)
	if err != nil {
		m.log.Warn("migrate: sending the memory ahead failed; the final upload sends it", "sandbox", rec.ID, "err", err)
	}
	m.log.Info("migrate: memory sent ahead", "sandbox", rec.ID, "pages", pages,
		"sent_bytes", st.UploadedBytes, "known_bytes", st.SharedBytes, "took", took)
	return st.UploadedBytes, took
}

func (m *Manager) sendPages(ctx context.Context, rec sandboxRec) (remote.Stats, int64, error) {
	pids, _, err := m.treePids(rec.ID, rec.Init)
	if err != nil {
		return remote.Stats{}, 0, err
	}
	budget := precopyBase
	if cg, err := cgroup.Load(m.cgroupName(rec.ID)); err == nil {
		if st, err := cg.Stats(); err == nil && st.MemoryBytes > 0 {
			budget += time.Duration(st.MemoryBytes/precopyRate) * time.Second
		}
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	w, err := m.store.Warmer(ctx)
	if err != nil {
		return remote.Stats{}, 0, err
	}
	buf := make([]byte, precopyBlock)
	var pages int64
	var werr error
	for _, pid := range pids {
		var addErr error
		st, _ := procmem.Pages(ctx, pid, buf, func(b []byte) error {
			addErr = w.Add(ctx, b)
			return addErr
		})
		pages += st.Pages
		if addErr != nil || ctx.Err() != nil {
			werr = errors.Join(addErr, ctx.Err())
			break
		}
		// An error of the process's own: it exited meanwhile, and has
		// nothing to send.
	}
	// What was gathered goes up, the budget spent or not.
	st, err := w.Close(parent)
	if werr == nil {
		werr = err
	}
	return st, pages, werr
}
