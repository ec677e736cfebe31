package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/client"
)

// HostFacts are the facts about the machine that bench numbers depend on
// most: the same build measured hot rollback p50 at 2-4 ms on one machine
// of a kind and 7-8 ms on another, with page-fault cost and the pool's
// backing the main differences. Every bench prints them in its header.
type HostFacts struct {
	CPU        string `json:"cpu"`
	CPUs       int    `json:"cpus"`
	Hypervisor string `json:"hypervisor"`
	// FaultUS is the cost of one page fault on fresh anonymous memory,
	// measured at the bench's start (µs per 4 KiB page, best of 3).
	FaultUS      float64 `json:"page_fault_us"`
	Kernel       string  `json:"kernel"`
	PoolBacking  string  `json:"pool_backing"`
	PoolNodeSize int     `json:"pool_node_size"`
	CRIU         string  `json:"criu"`
	Load         string  `json:"loadavg"`
}

// faultBytes is how much fresh memory the fault probe touches.
const faultBytes = 32 << 20

// GatherHost collects the host facts, from the daemon (pool) and from
// the machine (the rest). Facts that cannot be read say "unknown".
func GatherHost(ctx context.Context, c *client.Client, criuPath string) HostFacts {
	f := HostFacts{CPU: cpuModel(), CPUs: runtime.NumCPU(), Hypervisor: hypervisor(), Kernel: kernel(),
		CRIU: criuVersion(criuPath), Load: loadAvg()}
	f.FaultUS = faultCost()
	f.PoolBacking = "unknown"
	if c != nil {
		if h, err := c.Host(ctx); err == nil {
			if h.Pool.Loop {
				f.PoolBacking = "btrfs on a loop file"
				if h.Pool.Backing != "" {
					f.PoolBacking += " (" + h.Pool.Backing + onFS(h.Pool.Backing) + ")"
				}
			} else {
				f.PoolBacking = "native btrfs"
				if h.Pool.Device != "" {
					f.PoolBacking += " (" + h.Pool.Device + ")"
				}
			}
			f.PoolNodeSize = h.Pool.NodeSize
		}
	}
	return f
}

// PrintHost writes the facts as header lines.
func PrintHost(w io.Writer, f HostFacts) {
	node := "unknown"
	if f.PoolNodeSize > 0 {
		node = fmt.Sprintf("%d", f.PoolNodeSize)
	}
	fault := "unknown"
	if f.FaultUS > 0 {
		fault = fmt.Sprintf("%.2f µs per 4 KiB page (fresh anonymous memory, %d MiB)", f.FaultUS, faultBytes>>20)
	}
	fmt.Fprintf(w, "host: %s, %d CPUs, hypervisor %s, load %s\n", f.CPU, f.CPUs, f.Hypervisor, f.Load)
	fmt.Fprintf(w, "host: page fault %s\n", fault)
	fmt.Fprintf(w, "host: kernel %s, CRIU %s, pool %s, node size %s\n\n", f.Kernel, f.CRIU, f.PoolBacking, node)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	return cpuinfoField(b, "model name", "unknown CPU")
}

// cpuinfoField returns the first value of key in /proc/cpuinfo text.
func cpuinfoField(b []byte, key, def string) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return def
}

// hypervisor names the hypervisor the kernel runs under: /sys/hypervisor
// (Xen), else the kernel's "Hypervisor detected" line from /dev/kmsg
// (read without blocking, so only what the ring still holds), else just
// whether the CPU flags say there is one.
func hypervisor() string {
	if b, err := os.ReadFile("/sys/hypervisor/type"); err == nil && len(bytes.TrimSpace(b)) > 0 {
		return string(bytes.TrimSpace(b))
	}
	if name := kmsgHypervisor(); name != "" {
		return name
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	return flagsHypervisor(cpuinfoField(b, "flags", ""))
}

// flagsHypervisor reads the cpuinfo flags: a guest has "hypervisor".
func flagsHypervisor(flags string) string {
	for _, f := range strings.Fields(flags) {
		if f == "hypervisor" {
			return "present (kind unknown)"
		}
	}
	if flags == "" {
		return "unknown"
	}
	return "none (bare metal)"
}

// kmsgHypervisor scans the kernel log ring for "Hypervisor detected: X".
func kmsgHypervisor() string {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	buf := make([]byte, 8192)
	for i := 0; i < 100000; i++ {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, syscall.EPIPE) {
			continue // a record overwritten while reading
		}
		if err != nil || n <= 0 {
			return ""
		}
		if name := kmsgRecordHypervisor(buf[:n]); name != "" {
			return name
		}
	}
	return ""
}

func kmsgRecordHypervisor(rec []byte) string {
	_, msg, ok := bytes.Cut(rec, []byte(";"))
	if !ok {
		return ""
	}
	_, name, ok := bytes.Cut(msg, []byte("Hypervisor detected: "))
	if !ok {
		return ""
	}
	line, _, _ := bytes.Cut(name, []byte("\n"))
	return string(bytes.TrimSpace(line))
}

func kernel() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func criuVersion(path string) string {
	if path == "" {
		return "unknown"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "unknown (" + path + ")"
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// onFS names the filesystem a file lives on, as ", on TYPE".
func onFS(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return ""
	}
	names := map[int64]string{unix.BTRFS_SUPER_MAGIC: "btrfs", unix.EXT4_SUPER_MAGIC: "ext4", unix.XFS_SUPER_MAGIC: "xfs",
		unix.TMPFS_MAGIC: "tmpfs", unix.OVERLAYFS_SUPER_MAGIC: "overlayfs"}
	if n, ok := names[int64(st.Type)]; ok {
		return ", on " + n
	}
	return fmt.Sprintf(", on fs 0x%x", st.Type)
}

// faultCost maps faultBytes of fresh anonymous memory, touches it a page
// at a time and returns µs per fault, the best of three (the CPU is
// shared: the best is the machine's, the rest is its neighbours').
func faultCost() float64 {
	page := os.Getpagesize()
	best := 0.0
	for range 3 {
		m, err := unix.Mmap(-1, 0, faultBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return 0
		}
		// No transparent huge pages: one fault per 4 KiB page.
		_ = unix.Madvise(m, unix.MADV_NOHUGEPAGE)
		t0 := time.Now()
		for i := 0; i < len(m); i += page {
			m[i] = 1
		}
		us := float64(time.Since(t0).Nanoseconds()) / 1000 / float64(len(m)/page)
		_ = unix.Munmap(m)
		if best == 0 || us < best {
			best = us
		}
	}
	return best
}
