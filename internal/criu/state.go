package criu

import (
	"fmt"
	"path/filepath"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
)

// StoppedTasks returns the processes of the images in dir (their PIDs
// in the dumped PID namespace) that were stopped by job control at the
// dump. A tree restored stopped (RestoreOptions.LeaveStopped) and then
// continued must not continue these: they were stopped at the instant,
// and a SIGCONT would also tell their parents they went on.
func StoppedTasks(dir string) (map[int]bool, error) {
	tree, err := readImage[*pstree.PstreeEntry](filepath.Join(dir, "pstree.img"))
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, e := range tree {
		pid := int(e.GetPid())
		core, err := readOne[*criu_core.CoreEntry](filepath.Join(dir, fmt.Sprintf("core-%d.img", pid)))
		if err != nil {
			return nil, err
		}
		if core.GetTc().GetTaskState() == taskStopped {
			out[pid] = true
		}
	}
	return out, nil
}
