//go:build linux && amd64

package template

import (
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/testutil"
)

// BenchmarkCopy100MiB sets a copy-on-write copy of a Python process with
// a 100 MiB heap (Clone) next to copying that heap once out of the
// process (process_vm_readv into a buffer already faulted in: the least
// any copying checkpoint pays while the process is stopped):
//
//	go test -run XXX -bench Copy100MiB ./internal/template
func BenchmarkCopy100MiB(b *testing.B) {
	testutil.RequireRoot(b)
	p := start(b, "-c", "import os, ctypes, time\nheap = bytearray(os.urandom(100 << 20))\nprint(ctypes.addressof((ctypes.c_char * len(heap)).from_buffer(heap)), len(heap), flush=True)\ntime.sleep(1000)\n")
	f := strings.Fields(p.line(b))
	addr, _ := strconv.ParseUint(f[0], 10, 64)
	size, _ := strconv.Atoi(f[1])
	pid := p.cmd.Process.Pid

	b.Run("template-clone", func(b *testing.B) {
		tr := NewTracer()
		defer tr.Close()
		for i := 0; i < b.N; i++ {
			cp, err := tr.Clone(pid, true)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = tr.Kill(cp)
			reap(cp)
			b.StartTimer()
		}
	})
	b.Run("copy-heap", func(b *testing.B) {
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = 1
		}
		local := []unix.Iovec{{Base: unsafe.SliceData(buf), Len: uint64(size)}}
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: size}}
		for i := 0; i < b.N; i++ {
			n, err := unix.ProcessVMReadv(pid, local, remote, 0)
			if err != nil || n != size {
				b.Fatalf("process_vm_readv: %d, %v", n, err)
			}
		}
	})
}
