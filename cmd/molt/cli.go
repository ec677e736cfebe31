package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/molt-sh/molt/internal/sched"
	"github.com/spf13/cobra"
)

type globals struct {
	root   string
	socket string
	json   bool
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "molt",
		Short:         "Checkpoint, rollback and fork for AI-agent sandboxes",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentFlags().StringVar(&g.root, "root", envOr("MOLT_ROOT", "/var/lib/molt"), "state root (env MOLT_ROOT)")
	root.PersistentFlags().StringVar(&g.socket, "socket", envOr("MOLT_SOCKET", client.DefaultSocket), "daemon socket (env MOLT_SOCKET)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print one JSON document on stdout")
	root.AddCommand(
		daemonCmd(g), hostCmd(g), imageCmd(g), createCmd(g), lsCmd(g), inspectCmd(g), rmCmd(g),
		stopCmd(g), startCmd(g), execCmd(g), checkpointCmd(g), checkpointsCmd(g), rollbackCmd(g),
		forkCmd(g), hibernateCmd(g), resumeCmd(g), turnCmd(g), turnsCmd(g), llmCmd(g), benchCmd(g), demoCmd(g),
	)
	return root
}

func (g *globals) client() *client.Client { return client.New(g.socket) }

// print writes v as JSON with --json, or calls human otherwise.
func (g *globals) print(v any, human func()) error {
	if g.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	human()
	return nil
}

func ctx() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func parseSize(s string) (int64, error) {
	in := s
	s = strings.TrimSpace(strings.ToUpper(s))
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || s == "" || s[0] == '+' {
		return 0, fmt.Errorf("bad size %q: want a number with an optional K, M, G or T suffix", in)
	}
	// A product that wraps would turn a huge limit into a small or
	// negative one, and a negative limit reads as none.
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("bad size %q: more than %d bytes", in, int64(math.MaxInt64))
	}
	return n * mult, nil
}

// parseReserve parses --disk-reserve: "auto" (core's default), a size
// ("0": none) or a percentage of the pool's size ("5%").
func parseReserve(s string) (bytes int64, percent float64, err error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "auto" || s == "":
		return 0, 0, nil
	case strings.HasSuffix(s, "%"):
		p, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		if err != nil || p <= 0 || p >= 100 {
			return 0, 0, fmt.Errorf("bad --disk-reserve %q: want a percentage above 0 and below 100", s)
		}
		return 0, p, nil
	}
	n, err := parseSize(s)
	if err != nil {
		return 0, 0, fmt.Errorf("bad --disk-reserve: %w", err)
	}
	if n == 0 {
		return -1, 0, nil
	}
	return n, 0, nil
}

func daemonCmd(g *globals) *cobra.Command {
	var poolSize, nodeSize, cacheDir, budget, sbBudget, ioBudget, diskReserve, defaultDisk string
	var defMemory, defPids, defCPUs string
	var defIOWeight int64
	var workers, criuLog int
	var dynMods, cow, tmpl, diskQuota, userns bool
	var usernsBase uint32
	var frozenDeadline time.Duration
	var sockGroup string
	var sockUIDs []int
	var seccompDefault string
	c := &cobra.Command{
		Use:   "daemon",
		Short: "Run the molt daemon in the foreground",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := parseSize(poolSize)
			if err != nil {
				return err
			}
			nodes, err := parseSize(nodeSize)
			if err != nil {
				return err
			}
			sbyBudget, err := parseSize(budget)
			if err != nil {
				return err
			}
			perSandbox, err := parseSize(sbBudget)
			if err != nil {
				return err
			}
			bps, err := parseSize(ioBudget)
			if err != nil {
				return err
			}
			reserve, reservePct, err := parseReserve(diskReserve)
			if err != nil {
				return err
			}
			defDisk, err := parseSize(defaultDisk)
			if err != nil {
				return fmt.Errorf("bad --default-disk: %w", err)
			}
			if frozenDeadline == 0 {
				frozenDeadline = -1 // none
			}
			defaults, err := parseResources(defMemory, defPids, defCPUs, defIOWeight)
			if err != nil {
				return err
			}
			if seccompDefault != v1.SeccompDefault && seccompDefault != v1.SeccompUnconfined {
				return fmt.Errorf("--seccomp-default %q: want %s or %s", seccompDefault, v1.SeccompDefault, v1.SeccompUnconfined)
			}
			if criuLog < 1 || criuLog > 4 {
				return fmt.Errorf("--criu-log-level %d: want 1 (errors) to 4 (debugging)", criuLog)
			}
			gid, err := daemon.ParseSocketGroup(sockGroup)
			if err != nil {
				return err
			}
			ctx, cancel := ctx()
			defer cancel()
			// With --json the daemon logs JSON lines on stderr.
			var log *slog.Logger
			if g.json {
				log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
			}
			return daemon.Run(ctx, daemon.Config{
				Config: core.Config{Root: g.root, PoolSize: size, PoolNodeSize: int(nodes), CacheDir: cacheDir, Version: version, Logger: log, StandbyBudget: sbyBudget,
					SandboxStandbyBudget: perSandbox, CRIULogLevel: criuLog, Sched: sched.Config{Workers: workers, BytesPerSec: bps}, NoFavorDynMods: !dynMods, NoCOWCapture: !cow, NoTemplateCapture: !tmpl,
					DiskReserve: reserve, DiskReservePercent: reservePct, FrozenDeadline: frozenDeadline, DefaultDisk: defDisk, NoDiskQuota: !diskQuota, DefaultResources: defaults, UserNS: userns, UserNSBase: usernsBase, SeccompDefault: seccompDefault},
				Socket: g.socket, SocketAccess: daemon.SocketAccess{Group: gid, UIDs: sockUIDs},
			})
		},
	}
	c.Flags().StringVar(&poolSize, "pool-size", "32G", "size of the btrfs loop file when the root is not on btrfs")
	c.Flags().StringVar(&nodeSize, "pool-node-size", "8K", "btrfs metadata node size of a new loop file (4K to 64K): small nodes keep snapshots of a long-lived, often checkpointed root cheap; an existing pool keeps its own")
	c.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "cache for debootstrap trees (env MOLT_CACHE_DIR)")
	c.Flags().StringVar(&budget, "standby-budget", "2G", "memory for pre-restored standbys (hot rollback) across the host; 0 disables them")
	c.Flags().StringVar(&sbBudget, "sandbox-standby-budget", "0", "default memory for one sandbox's standbys, within --standby-budget (0: no bound of its own; molt create --standby-budget sets one per sandbox)")
	c.Flags().IntVar(&workers, "sched-workers", 0, "checkpoint background jobs (storing, standbys, GC) run at once host-wide (0: 1 on up to 2 CPUs, else half the CPUs)")
	c.Flags().StringVar(&diskReserve, "disk-reserve", "auto", "space kept free in the pool and on the filesystem under a loop pool: checkpoints, forks and rollbacks that would leave less are refused (resource_exhausted); a size, a percentage of the pool (5%), 0 for none, or auto (1G, or 5% of a pool under 20G)")
	c.Flags().StringVar(&defaultDisk, "default-disk", "0", "disk quota of a sandbox created without --disk: its root and its checkpoints' files together, past which its writes fail with EDQUOT (0: none; sandboxes together are still kept out of --disk-reserve)")
	c.Flags().BoolVar(&diskQuota, "disk-quota", true, "turn btrfs simple quotas on in the pool (Linux 6.7+; the pool then no longer mounts on older kernels) for per-sandbox disk quotas")
	c.Flags().StringVar(&ioBudget, "sched-io", "0", "bytes per second background jobs may write, as 200M (0: unlimited)")
	c.Flags().BoolVar(&cow, "cow-capture", true, "full checkpoints of sandboxes with over 32 MiB of private memory write-protect it in the frozen window and copy the pages after the thaw (single-threaded processes without shared memory; others are copied frozen, and the checkpoint says why)")
	c.Flags().BoolVar(&tmpl, "template-capture", true, "full checkpoints of sandboxes with over 32 MiB of private memory copy every process in the frozen window (an injected clone each) and dump the copies with CRIU after the thaw, when the tree allows it (single-threaded processes, no shared memory, sockets or terminals, no signal pending, empty pipes); others take the --cow-capture path, and the checkpoint says why")
	c.Flags().BoolVar(&dynMods, "cgroup-favordynmods", true, "set favordynmods on the host's cgroup2 mount and keep it set: cgroup moves (every restore, fork and standby does some) skip an RCU grace period each; forks and exits host-wide cost a little more")
	c.Flags().DurationVar(&frozenDeadline, "frozen-deadline", core.DefaultFrozenDeadline, "longest a capture may keep a sandbox frozen (fs snapshot, CRIU dump, copy-on-write protection, template copies), plus 1 s per 128 MiB of the tree's private memory for a full checkpoint; past it the capture is aborted (CRIU killed), the sandbox thawed and the error names the step that hung (0: no deadline)")
	c.Flags().StringVar(&sockGroup, "socket-group", "", "group (name or gid) whose members may use the daemon socket (mode 0660); without it only root may (0600)")
	c.Flags().IntSliceVar(&sockUIDs, "socket-uid", nil, "further uid allowed on the daemon socket, checked with SO_PEERCRED (repeatable; the user still needs the socket file's permission, e.g. through --socket-group)")
	c.Flags().StringVar(&defMemory, "default-memory", "auto", "memory limit of a sandbox created without --memory: a size, 0 or unlimited for none, auto for half the host's RAM up to 4G")
	c.Flags().StringVar(&defPids, "default-pids", "auto", "process limit of a sandbox created without --pids: a count, 0 or unlimited for none, auto for 4096")
	c.Flags().StringVar(&defCPUs, "default-cpus", "auto", "CPU limit of a sandbox created without --cpus: CPUs as 1.5, 0 or unlimited for none, auto for the host's CPU count")
	c.Flags().Int64Var(&defIOWeight, "default-io-weight", 0, "block I/O weight of a sandbox created without --io-weight (0: the kernel's default)")
	c.Flags().BoolVar(&userns, "userns", false, "give each sandbox created from now on a user namespace: root inside is a block of 65536 unprivileged host uids and gids of its own (docs/architecture.md, User namespaces); sandboxes keep what they were created with")
	c.Flags().Uint32Var(&usernsBase, "userns-base", core.DefaultUserNSBase, "first host uid and gid of the --userns blocks (65536 ids each, the first free one per sandbox)")
	c.Flags().StringVar(&seccompDefault, "seccomp-default", v1.SeccompDefault, "system call filter of sandboxes created without --seccomp: default (molt's profile, docs/security.md) or unconfined (for comparisons)")
	c.Flags().IntVar(&criuLog, "criu-log-level", core.DefaultCRIULogLevel, "CRIU's log level for checkpoints and restores: 1 errors, 2 and warnings, 4 debugging (adds milliseconds to every checkpoint's frozen window)")
	return c
}

func hostCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "host", Short: "Show the host, its storage pool and what molt can do here", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			h, err := g.client().Host(ctx)
			if err != nil {
				return err
			}
			return g.print(h, func() {
				fmt.Printf("molt %s on Linux %s, cgroup %s\n", h.Version, h.Kernel, h.Cgroup)
				fmt.Printf("root %s, pool %s (%s free of %s, %s nodes)", h.Root, h.Pool.Dir, human(int64(h.Pool.FreeBytes)), human(int64(h.Pool.SizeBytes)), human(int64(h.Pool.NodeSize)))
				if h.Pool.Loop {
					fmt.Printf(", loop file %s on %s", h.Pool.Backing, h.Pool.Device)
				}
				fmt.Printf("\n%d sandboxes\n", h.Sandboxes)
				for _, f := range h.Features {
					if f.Supported {
						fmt.Printf("  + %-16s %s\n", f.Name, f.Detail)
					} else {
						fmt.Printf("  - %-16s %s\n", f.Name, f.Reason)
					}
				}
			})
		},
	}
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func imageCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "image", Short: "Build, import, list and remove images"}
	var suite, mirror string
	var packages []string
	var force bool
	build := &cobra.Command{
		Use: "build NAME", Short: "Build a Debian image with debootstrap (cached)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			start := time.Now()
			img, err := g.client().BuildImage(ctx, v1.ImageBuildRequest{Name: args[0], Suite: suite, Packages: packages, Mirror: mirror, Force: force},
				func(line string) { fmt.Fprintln(os.Stderr, line) })
			if err != nil {
				return err
			}
			return g.print(img, func() {
				fmt.Printf("%s\t(%s, %.1fs)\n", img.Name, img.Source, time.Since(start).Seconds())
			})
		},
	}
	build.Flags().StringVar(&suite, "suite", "bookworm", "Debian suite")
	build.Flags().StringSliceVar(&packages, "packages", nil, "extra packages, comma separated")
	build.Flags().StringVar(&mirror, "mirror", "", "Debian mirror URL")
	build.Flags().BoolVar(&force, "force", false, "rebuild and replace an existing image")
	imp := &cobra.Command{
		Use: "import NAME PATH", Short: "Import a directory or a tarball (.tar, .tar.gz) as an image", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			p, err := filepath.Abs(args[1])
			if err != nil {
				return err
			}
			img, err := g.client().ImportImage(ctx, v1.ImageImportRequest{Name: args[0], Path: p})
			if err != nil {
				return err
			}
			return g.print(img, func() { fmt.Println(img.Name) })
		},
	}
	ls := &cobra.Command{
		Use: "ls", Short: "List images", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().Images(ctx)
			if err != nil {
				return err
			}
			return g.print(l, func() {
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSOURCE\tCREATED")
				for _, i := range l {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", i.Name, i.Source, i.Created.Local().Format(time.DateTime))
				}
				tw.Flush()
			})
		},
	}
	rm := &cobra.Command{
		Use: "rm NAME", Short: "Remove an image (sandboxes made from it are unaffected)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			if err := g.client().RemoveImage(ctx, args[0]); err != nil {
				return err
			}
			return g.print(map[string]string{"removed": args[0]}, func() { fmt.Println(args[0]) })
		},
	}
	c.AddCommand(build, imp, ls, rm)
	return c
}

func parseEnv(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad environment variable %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	return env, nil
}

func createCmd(g *globals) *cobra.Command {
	var name, hostname, memory, pids, cpus, standbyBudget, disk, filter string
	var env []string
	var ioWeight int64
	c := &cobra.Command{
		Use: "create IMAGE", Short: "Create and start a sandbox; prints its ID", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			e, err := parseEnv(env)
			if err != nil {
				return err
			}
			res, err := parseResources(memory, pids, cpus, ioWeight)
			if err != nil {
				return err
			}
			var sby int64 // the daemon's default
			switch standbyBudget {
			case "":
			case "none":
				sby = -1
			default:
				if sby, err = parseSize(standbyBudget); err != nil {
					return err
				}
				if sby == 0 { // 0, 0M...: none (the API's 0 is the default)
					sby = -1
				}
			}
			var diskBytes int64 // the daemon's default
			switch disk {
			case "":
			case "none":
				diskBytes = -1
			default:
				if diskBytes, err = parseSize(disk); err != nil {
					return fmt.Errorf("bad --disk: %w", err)
				}
				if diskBytes == 0 {
					diskBytes = -1
				}
			}
			req := v1.SandboxCreateRequest{Image: args[0], Name: name, Hostname: hostname, Env: e,
				Resources: v1.Resources{MemoryBytes: res.MemoryBytes, Pids: res.Pids, CPUMillis: res.CPUMillis, IOWeight: res.IOWeight, StandbyBudgetBytes: sby, DiskBytes: diskBytes}}
			if req.Seccomp, req.SeccompProfile, err = seccompFlag(filter); err != nil {
				return err
			}
			sb, err := g.client().Create(ctx, req)
			if err != nil {
				return err
			}
			return g.print(sb, func() { fmt.Println(sb.ID) })
		},
	}
	c.Flags().StringVar(&name, "name", "", "sandbox name")
	c.Flags().StringVar(&hostname, "hostname", "", "hostname (default: the name, or molt-ID)")
	c.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE for every command (repeatable)")
	c.Flags().StringVar(&memory, "memory", "", "memory limit (e.g. 2G; 0 or unlimited for none; default: the daemon's --default-memory)")
	c.Flags().StringVar(&pids, "pids", "", "process (task) limit (0 or unlimited for none; default: the daemon's --default-pids)")
	c.Flags().StringVar(&cpus, "cpus", "", "CPU limit in CPUs, as 1.5 (0 or unlimited for none; default: the daemon's --default-cpus)")
	c.Flags().Int64Var(&ioWeight, "io-weight", 0, "proportional block I/O weight, 1-10000 on cgroup v2 and 1-1000 on v1 (0: the kernel's default, 100); refused where the host has no weight file")
	c.Flags().StringVar(&disk, "disk", "", "disk quota: the sandbox's files and its checkpoints' together, past which its writes fail with EDQUOT (e.g. 10G; none for no quota; default: the daemon's --default-disk)")
	c.Flags().StringVar(&standbyBudget, "standby-budget", "", "memory for this sandbox's standbys (hot rollback), within the host's (e.g. 512M; 0 for none; default: the daemon's --sandbox-standby-budget)")
	c.Flags().StringVar(&filter, "seccomp", "", "system call filter: default (molt's profile, docs/security.md), unconfined, or the path of a Docker/OCI-format JSON profile, read here and sent to the daemon (default: the daemon's --seccomp-default)")
	return c
}

// seccompFlag turns --seccomp into the request's fields: a mode, or a
// profile read from the file it names.
func seccompFlag(v string) (mode, profile string, err error) {
	switch v {
	case "", v1.SeccompDefault, v1.SeccompUnconfined:
		return v, "", nil
	}
	f, err := os.Open(v)
	if err != nil {
		return "", "", fmt.Errorf("--seccomp: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, v1.MaxSeccompProfileBytes+1))
	if err != nil {
		return "", "", fmt.Errorf("--seccomp: %w", err)
	}
	if len(b) > v1.MaxSeccompProfileBytes {
		return "", "", fmt.Errorf("--seccomp %s: more than %d bytes", v, v1.MaxSeccompProfileBytes)
	}
	return v1.SeccompCustom, string(b), nil
}

func lsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "ls", Short: "List sandboxes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().Sandboxes(ctx)
			if err != nil {
				return err
			}
			return g.print(l, func() {
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tIMAGE\tSTATE\tHEAD\tCREATED")
				for _, s := range l {
					state := s.State
					if s.Reason != "" {
						state += " (" + s.Reason + ")"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, dash(s.Name), s.Image, state, dash(s.Head), s.Created.Local().Format(time.DateTime))
				}
				tw.Flush()
			})
		},
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func inspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "inspect SANDBOX", Short: "Show a sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			sb, err := g.client().Sandbox(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(sb, func() {
				fmt.Printf("id:        %s\nname:      %s\nimage:     %s\nhostname:  %s\nstate:     %s\n", sb.ID, dash(sb.Name), sb.Image, sb.Hostname, sb.State)
				if sb.Reason != "" {
					fmt.Printf("reason:    %s\n", sb.Reason)
				}
				fmt.Printf("head:      %s\ncreated:   %s\n", dash(sb.Head), sb.Created.Local().Format(time.RFC3339))
				r := sb.Resources
				fmt.Printf("limits:    memory %s, pids %s, cpus %s", showLimit(r.MemoryBytes, human), showLimit(r.Pids, func(v int64) string { return strconv.FormatInt(v, 10) }),
					showLimit(r.CPUMillis, func(v int64) string { return strconv.FormatFloat(float64(v)/1000, 'f', -1, 64) }))
				if r.IOWeight > 0 {
					fmt.Printf(", io weight %d", r.IOWeight)
				}
				fmt.Println()
				if sb.LimitsTampered > 0 && sb.LastTampered != nil {
					fmt.Printf("tampered:  %d times; last %s at %s: %s\n", sb.LimitsTampered, sb.LastTampered.When, sb.LastTampered.Time.Local().Format(time.RFC3339), strings.Join(sb.LastTampered.Limits, "; "))
				}
				if sb.ForkedFrom != "" {
					fmt.Printf("forked:    from checkpoint %s\n", sb.ForkedFrom)
				}
				if sb.State == v1.StateRunning {
					fmt.Printf("init pid:  %d\nprocesses: %d\nmemory:    %s\n", sb.Pid, sb.Processes, human(sb.MemoryBytes))
					if len(sb.Standbys) > 0 {
						fmt.Printf("standbys:  %s (%s)\n", strings.Join(sb.Standbys, ", "), human(sb.StandbyBytes))
					}
				}
				if sb.Resources.DiskBytes > 0 {
					fmt.Printf("disk:      %s of %s\n", human(sb.DiskUsedBytes), human(sb.Resources.DiskBytes))
				} else if sb.DiskUsedBytes > 0 {
					fmt.Printf("disk:      %s (no quota)\n", human(sb.DiskUsedBytes))
				}
				for _, s := range sb.Sessions {
					fmt.Printf("session:   %s (pid %d)\n", s.Name, s.Pid)
				}
			})
		},
	}
}

func rmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "rm SANDBOX...", Short: "Remove sandboxes with their processes and checkpoints", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			var removed []string
			for _, a := range args {
				if err := g.client().Remove(ctx, a); err != nil {
					return err
				}
				removed = append(removed, a)
			}
			return g.print(map[string][]string{"removed": removed}, func() {
				for _, r := range removed {
					fmt.Println(r)
				}
			})
		},
	}
}

func stopCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "stop SANDBOX", Short: "Kill a sandbox's processes; its files stay", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			sb, err := g.client().Stop(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(sb, func() { fmt.Println(sb.ID, sb.State) })
		},
	}
}

func startCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "start SANDBOX", Short: "Start a stopped or lost sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			sb, err := g.client().Start(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(sb, func() { fmt.Println(sb.ID, sb.State) })
		},
	}
}

func execCmd(g *globals) *cobra.Command {
	var session, cwd, user string
	var env []string
	var detach, noStdin bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "exec SANDBOX [--session S] [--detach] -- CMD...",
		Short: "Run a command in a sandbox (exit code = the command's)",
		Long: "Run a command in a sandbox. Output is streamed, stdin is passed (unless --no-stdin), and molt exits with the command's exit code.\n" +
			"With --session S the arguments are shell text run in the persistent bash session S (created on first use): cwd, variables and functions persist between calls.\n" +
			"A command killed at --timeout exits with 124.",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e, err := parseEnv(env)
			if err != nil {
				return err
			}
			cl := g.client()
			ref, argv := args[0], args[1:]
			if session != "" {
				if detach || len(env) > 0 || cwd != "" || user != "" {
					return fmt.Errorf("--session cannot be combined with --detach, --env, --cwd or --user (use shell text: cd, export)")
				}
				sctx, stop := signal.NotifyContext(ctx, os.Interrupt)
				defer stop()
				res, err := cl.SessionRun(sctx, ref, session, v1.SessionRunRequest{Command: strings.Join(argv, " "), TimeoutMS: timeout.Milliseconds()})
				if err != nil {
					return err
				}
				if g.json {
					if err := g.print(res, nil); err != nil {
						return err
					}
				} else {
					io.WriteString(os.Stdout, res.Stdout)
					io.WriteString(os.Stderr, res.Stderr)
				}
				if res.ExitCode != 0 {
					return &exitError{code: res.ExitCode}
				}
				return nil
			}
			req := v1.ExecRequest{Args: argv, Env: e, Cwd: cwd, User: user, TimeoutMS: timeout.Milliseconds()}
			if detach {
				pid, err := cl.ExecDetached(ctx, ref, req)
				if err != nil {
					return err
				}
				return g.print(v1.ExecDetached{Pid: pid}, func() { fmt.Println(pid) })
			}
			eio := client.ExecIO{Stdout: os.Stdout, Stderr: os.Stderr}
			var out, errb strings.Builder
			if g.json {
				eio.Stdout, eio.Stderr = &out, &errb
			}
			if !noStdin {
				eio.Stdin = os.Stdin
			}
			sigs := make(chan os.Signal, 4)
			nums := make(chan int, 4)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
			defer signal.Stop(sigs)
			go func() {
				for s := range sigs {
					nums <- int(s.(syscall.Signal))
				}
			}()
			eio.Signals = nums
			st, err := cl.Exec(ctx, ref, req, eio)
			if err != nil {
				return err
			}
			if g.json {
				if err := g.print(map[string]any{"exit_code": st.ExitCode, "signal": st.Signal, "timed_out": st.TimedOut, "stdout": out.String(), "stderr": errb.String()}, nil); err != nil {
					return err
				}
			}
			if st.ExitCode != 0 {
				return &exitError{code: st.ExitCode}
			}
			return nil
		},
	}
	c.Flags().StringVar(&session, "session", "", "run the text in this persistent bash session")
	c.Flags().BoolVarP(&detach, "detach", "d", false, "leave the command running in the background; prints its PID")
	c.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	c.Flags().StringVarP(&cwd, "cwd", "w", "", "working directory inside the sandbox")
	c.Flags().StringVarP(&user, "user", "u", "", "user name or uid[:gid] inside the sandbox (default root)")
	c.Flags().DurationVar(&timeout, "timeout", 0, "kill the command after this long (exit code 124)")
	c.Flags().BoolVarP(&noStdin, "no-stdin", "n", false, "give the command /dev/null as stdin")
	return c
}

func checkpointCmd(g *globals) *cobra.Command {
	var kind, label string
	var wait, keep bool
	c := &cobra.Command{
		Use: "checkpoint SANDBOX", Short: "Take a checkpoint; prints its ID", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			req := v1.CheckpointRequest{Kind: kind, Label: label, Wait: wait, Keep: keep}
			if err := req.Validate(); err != nil {
				return err
			}
			if kind == v1.KindAuto {
				res, err := g.client().CheckpointAuto(ctx, args[0], label)
				if err != nil {
					return err
				}
				return g.print(res, func() { printTurn(res) })
			}
			ck, err := g.client().Checkpoint(ctx, args[0], req)
			if err != nil {
				return err
			}
			return g.print(ck, func() { fmt.Println(ck.ID) })
		},
	}
	c.Flags().StringVar(&kind, "kind", "fs", "fs (files), full (files and processes) or auto (what the turn's effects need: ends the turn, as molt turn)")
	c.Flags().StringVar(&label, "label", "", "label to refer to the checkpoint by")
	c.Flags().BoolVar(&keep, "keep", false, "keep a standby ready for this full checkpoint (hot rollback) even when it is no longer the head")
	c.Flags().BoolVar(&wait, "wait", false, "return once the checkpoint is committed (a full checkpoint otherwise returns pending, as soon as its instant is captured)")
	rm := &cobra.Command{
		Use: "rm CHECKPOINT...", Short: "Delete checkpoints (their children move to their parent)", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			for _, a := range args {
				if err := g.client().DeleteCheckpoint(ctx, a); err != nil {
					return err
				}
			}
			return g.print(map[string][]string{"removed": args}, func() {
				for _, a := range args {
					fmt.Println(a)
				}
			})
		},
	}
	inspect := &cobra.Command{
		Use: "inspect CHECKPOINT", Short: "Show a checkpoint", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			ck, err := g.client().CheckpointInfo(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(ck, func() {
				fmt.Printf("id:       %s\nsandbox:  %s\nparent:   %s\nkind:     %s\nlabel:    %s\ncreated:  %s\nstall:    %.2f ms\nduration: %.2f ms\n",
					ck.ID, ck.Sandbox, dash(ck.Parent), ck.Kind, dash(ck.Label), ck.Created.Local().Format(time.RFC3339), ck.StallMS, ck.DurationMS)
				if ck.Capture != "" {
					fmt.Printf("capture:  %s%s\n", ck.Capture, captureNote(ck))
				}
				if p := ck.StallParts; p != nil {
					fmt.Printf("frozen:   protection %.2f ms, CRIU %.2f ms, snapshot %.2f ms (next to CRIU)\n", p.ProtectMS, p.CRIUMS, p.SnapshotMS)
				}
				switch {
				case ck.Pending:
					fmt.Println("state:    pending (captured, being stored)")
				case ck.Failed:
					fmt.Printf("state:    FAILED, holds nothing: %s\n", ck.FailedReason)
				}
			})
		},
	}
	verify := &cobra.Command{
		Use: "verify CHECKPOINT", Short: "Check a checkpoint's stored objects against its manifest", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			ck, err := g.client().VerifyCheckpoint(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(ck, func() { fmt.Printf("%s: ok\n", ck.ID) })
		},
	}
	c.AddCommand(rm, inspect, verify)
	return c
}

func checkpointsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "checkpoints SANDBOX", Short: "Print a sandbox's checkpoint tree", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			cl := g.client()
			l, err := cl.Checkpoints(ctx, args[0])
			if err != nil {
				return err
			}
			sb, err := cl.Sandbox(ctx, args[0])
			if err != nil {
				return err
			}
			if l == nil {
				l = []v1.Checkpoint{}
			}
			return g.print(l, func() { printTree(os.Stdout, l, sb.Head) })
		},
	}
}

// printTree prints checkpoints as a tree; roots are those whose parent is
// not in the list (or empty). head is marked.
func printTree(w io.Writer, l []v1.Checkpoint, head string) {
	byID := map[string]bool{}
	children := map[string][]v1.Checkpoint{}
	for _, c := range l {
		byID[c.ID] = true
	}
	var roots []v1.Checkpoint
	for _, c := range l {
		if c.Parent == "" || !byID[c.Parent] {
			roots = append(roots, c)
		} else {
			children[c.Parent] = append(children[c.Parent], c)
		}
	}
	var walk func(c v1.Checkpoint, prefix string, last bool, top bool)
	walk = func(c v1.Checkpoint, prefix string, last, top bool) {
		branch, next := "├── ", prefix+"│   "
		if last {
			branch, next = "└── ", prefix+"    "
		}
		if top {
			branch, next = "", prefix
		}
		line := fmt.Sprintf("%s%s%s  %s  %s", prefix, branch, c.ID, c.Kind, c.Created.Local().Format("15:04:05"))
		if c.Label != "" {
			line += "  [" + c.Label + "]"
		}
		if top && c.Parent != "" {
			line += "  (from " + c.Parent + ")"
		}
		if c.ID == head {
			line += "  <- head"
		}
		switch {
		case c.Pending:
			line += "  (pending)"
		case c.Failed:
			// Listed until deleted: it was reported, and it holds nothing.
			line += "  FAILED: " + c.FailedReason
		}
		fmt.Fprintln(w, line)
		kids := children[c.ID]
		sort.Slice(kids, func(i, j int) bool { return kids[i].Created.Before(kids[j].Created) })
		for i, k := range kids {
			walk(k, next, i == len(kids)-1, false)
		}
	}
	for _, r := range roots {
		walk(r, "", true, true)
	}
}

func rollbackCmd(g *globals) *cobra.Command {
	var tier string
	c := &cobra.Command{
		Use: "rollback SANDBOX CHECKPOINT", Short: "Return a sandbox to a checkpoint", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			res, err := g.client().RollbackWith(ctx, args[0], v1.RollbackRequest{Checkpoint: args[1], Tier: tier})
			if err != nil {
				return err
			}
			return g.print(res, func() {
				fmt.Printf("%s rolled back to %s in %.1f ms (%s)\n", res.Sandbox, res.Checkpoint, res.DurationMS, res.Tier)
				if res.Note != "" {
					fmt.Println(res.Note)
				}
			})
		},
	}
	c.Flags().StringVar(&tier, "tier", "", "hot, warm (restore from the images even with a standby ready) or cold (also rehash every object first); default the fastest available")
	return c
}

func forkCmd(g *globals) *cobra.Command {
	var n int
	var reseed bool
	c := &cobra.Command{
		Use: "fork SANDBOX|CHECKPOINT", Short: "Create sandboxes from a checkpoint (or from a sandbox's current state); prints their IDs", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			res, err := g.client().ForkWith(ctx, args[0], v1.ForkRequest{N: n, Reseed: reseed})
			if err != nil {
				return err
			}
			return g.print(res, func() {
				for _, s := range res.Sandboxes {
					fmt.Println(s.ID)
				}
			})
		},
	}
	c.Flags().IntVarP(&n, "n", "n", 1, fmt.Sprintf("number of sandboxes (1..%d)", v1.MaxForks))
	c.Flags().BoolVar(&reseed, "reseed", false, "give each fork's sessions a fresh random seed ($RANDOM); see docs/architecture.md for what else can and cannot be reseeded")
	return c
}

func hibernateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "hibernate SANDBOX", Short: "Checkpoint a sandbox fully and stop it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			sb, err := g.client().Hibernate(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(sb, func() { fmt.Println(sb.ID, sb.State) })
		},
	}
}

func resumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "resume SANDBOX", Short: "Resume a hibernated sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			sb, err := g.client().Resume(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(sb, func() { fmt.Println(sb.ID, sb.State) })
		},
	}
}

// captureNote is why a full checkpoint copied its memory frozen, if it
// says, as " (why)".
func captureNote(ck v1.Checkpoint) string {
	if ck.CaptureNote == "" {
		return ""
	}
	return " (" + ck.CaptureNote + ")"
}
