// Merge's typed access to CRIU images: the entries of each image kind it
// reads, the images it writes, and the mappings a process's images hold.

package criu

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	pipe_data "github.com/checkpoint-restore/go-criu/v7/crit/images/pipe-data"
	"google.golang.org/protobuf/proto"
)

// imageKinds are the CRIU image kinds Merge reads, by Go type.
var imageKinds = map[string]string{
	"*pstree.PstreeEntry":         "PSTREE",
	"*criu_core.TaskKobjIdsEntry": "IDS",
	"*criu_core.CoreEntry":        "CORE",
	"*fdinfo.FdinfoEntry":         "FDINFO",
	"*fdinfo.FileEntry":           "FILES",
	"*mm.MmEntry":                 "MM",
	"*fs.FsEntry":                 "FS",
	"*inventory.InventoryEntry":   "INVENTORY",
	"*pipe_data.PipeDataEntry":    "PIPES_DATA",
	"*pagemap.PagemapHead":        "PAGEMAP",
}

// readImage reads the entries of a CRIU image of T.
func readImage[T proto.Message](path string) ([]T, error) {
	var zero T
	kind, ok := imageKinds[fmt.Sprintf("%T", zero)]
	if !ok {
		return nil, fmt.Errorf("merge: no image kind for %T", zero)
	}
	ents, err := readEntries(path, kind, func(int) proto.Message { return zero.ProtoReflect().Type().New().Interface() }, nil)
	if err != nil {
		return nil, fmt.Errorf("merge: %w", err)
	}
	out := make([]T, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.msg.(T))
	}
	return out, nil
}

func readOne[T proto.Message](path string) (T, error) {
	all, err := readImage[T](path)
	if err != nil {
		var zero T
		return zero, err
	}
	if len(all) != 1 {
		var zero T
		return zero, fmt.Errorf("merge: %s holds %d entries, want 1", path, len(all))
	}
	return all[0], nil
}

// readPagemap reads a pagemap image: its head, then its entries.
func readPagemap(path string) (*pagemap.PagemapHead, []imageEntry, error) {
	ents, err := readEntries(path, "PAGEMAP", func(i int) proto.Message {
		if i == 0 {
			return &pagemap.PagemapHead{}
		}
		return &pagemap.PagemapEntry{}
	}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("merge: %w", err)
	}
	if len(ents) == 0 {
		return nil, nil, fmt.Errorf("merge: %s has no head", path)
	}
	return ents[0].msg.(*pagemap.PagemapHead), ents, nil
}

// readPipesData reads a pipes-data image: each entry followed by the
// pipe's queued bytes.
func readPipesData(path string) ([]imageEntry, error) {
	ents, err := readEntries(path, "PIPES_DATA", func(int) proto.Message { return &pipe_data.PipeDataEntry{} },
		func(m proto.Message) int { return int(m.(*pipe_data.PipeDataEntry).GetBytes()) })
	if err != nil {
		return nil, fmt.Errorf("merge: %w", err)
	}
	return ents, nil
}

func writeImage(path, kind string, msgs []proto.Message) error {
	ents := make([]imageEntry, len(msgs))
	for i, m := range msgs {
		ents[i].msg = m
	}
	if err := writeEntries(path, kind, ents); err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	return nil
}

// moveFile renames src to dst, copying across file systems.
func moveFile(src, dst string) error {
	err := os.Rename(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		if err != nil {
			return fmt.Errorf("merge: %w", err)
		}
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("merge: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	return os.Remove(src)
}

// MappingStarts returns the start addresses of the memory areas that
// the images in dir hold for process pid, in the order of /proc/PID/maps,
// leaving out the kernel's own ([vdso], [vvar], [vsyscall]: CRIU takes
// [vvar] and [vvar_vclock] as one).
func MappingStarts(dir string, pid int) ([]uint64, error) {
	mme, err := readOne[*mm.MmEntry](filepath.Join(dir, fmt.Sprintf("mm-%d.img", pid)))
	if err != nil {
		return nil, err
	}
	out := make([]uint64, 0, len(mme.GetVmas()))
	for _, v := range mme.GetVmas() {
		if v.GetStatus()&vmaKernel == 0 {
			out = append(out, v.GetStart())
		}
	}
	return out, nil
}
