package criu

import (
	"fmt"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
)

// TreeTasks counts the tasks (threads) a restore of the images in dir
// creates, from its pstree.img: what a restored tree takes of a pids
// limit. The images are the daemon's own, but the count is bounded
// anyway, as a limit derived from it must not overflow.
func TreeTasks(dir string) (int64, error) {
	ps, err := readImage[*pstree.PstreeEntry](filepath.Join(dir, "pstree.img"))
	if err != nil {
		return 0, fmt.Errorf("count tasks of %s: %w", dir, err)
	}
	var n int64
	for _, p := range ps {
		n += int64(max(len(p.GetThreads()), 1))
	}
	return min(n, 1<<22), nil
}
