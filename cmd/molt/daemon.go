// molt daemon and molt host: the daemon's flags, and what it reports about
// the host it runs on.

package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/molt-sh/molt/internal/egress"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sched"
	"github.com/molt-sh/molt/internal/turn"
	"github.com/molt-sh/molt/internal/units"
	"github.com/spf13/cobra"
)

// without maps an on/off flag of the daemon or bench to core's option
// switching that optimization off: opt when the flag is off.
func without(on bool, opt core.Option) []core.Option {
	if on {
		return nil
	}
	return []core.Option{opt}
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
	var poolSize, nodeSize, cacheDir, budget, sbBudget, ioBudget, diskReserve, defaultDisk, defMemory, defPids, defCPUs string
	var defIOWeight int64
	var workers, criuLog int
	var dynMods, cow, tmpl, diskQuota, userns bool
	var usernsBase uint32
	var frozenDeadline time.Duration
	var sockGroup string
	var sockUIDs []int
	var seccompDefault string
	var trustKeys, redact []string
	recLimit := sizeFlag(turn.DefaultRecordLimit)
	var eg egressFlags
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
			egressRange, err := netip.ParsePrefix(eg.rng)
			if err != nil || !egressRange.Addr().Is4() || egressRange.Bits() > 28 {
				return fmt.Errorf("--egress-range %q: want an IPv4 prefix of /28 or more addresses", eg.rng)
			}
			gid, err := daemon.ParseSocketGroup(sockGroup)
			if err != nil {
				return err
			}
			ctx, cancel := ctx()
			defer cancel()
			kek, prevKEK, store, err := eg.open(ctx)
			if err != nil {
				return err
			}
			// With --json the daemon logs JSON lines on stderr.
			var log *slog.Logger
			if g.json {
				log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
			}
			return daemon.Run(ctx, daemon.Config{
				Config: core.Config{RecordLimit: int64(recLimit), Redact: redact, TrustedKeys: trustKeys, KEK: kek, PreviousKEK: prevKEK, Store: store, StoreCache: int64(eg.store.cache), CgroupParent: eg.store.cgroupParent, Root: g.root, PoolSize: size, PoolNodeSize: int(nodes), CacheDir: cacheDir, Version: version, Logger: log, StandbyBudget: sbyBudget,
					SandboxStandbyBudget: perSandbox, CRIULogLevel: criuLog, Sched: sched.Config{Workers: workers, BytesPerSec: bps},
					DiskReserve: reserve, DiskReservePercent: reservePct, FrozenDeadline: frozenDeadline, DefaultDisk: defDisk, DefaultResources: meta.Resources(defaults), UserNS: userns, UserNSBase: usernsBase, SeccompDefault: seccompDefault,
					Egress: core.EgressConfig{Range: egressRange, Uplink: eg.uplink, DNS: eg.dns, CAFile: eg.caFile,
						CompensateAttempts: eg.comp.attempts, CompensateBackoff: eg.comp.backoff, CompensateTimeout: eg.comp.timeout}},
				Options: slices.Concat(without(dynMods, core.WithoutFavorDynMods()), without(cow, core.WithoutCOWCapture()),
					without(tmpl, core.WithoutTemplateCapture()), without(diskQuota, core.WithoutDiskQuota()), without(eg.store.lazy, core.WithoutLazyResume())),
				Socket: g.socket, SocketAccess: daemon.SocketAccess{Group: gid, UIDs: sockUIDs}, Listen: eg.listen, TLS: eg.tls, UI: eg.ui.addr, UIExpose: eg.ui.expose, UITokenFile: eg.ui.tokenFile,
				StoreGCEvery: eg.store.gcEvery, StoreGCGrace: eg.store.gcGrace})
		},
	}
	c.Flags().StringArrayVar(&trustKeys, "trust-key", nil, "public key file (another host's ROOT/keys/host.pub) whose signed checkpoints this host accepts, besides its own and ROOT/keys/trusted/*.pub (repeatable)")
	c.Flags().StringArrayVar(&redact, "redact", nil, "regular expression (Go syntax) of a credential to redact from turn logs and effect ledgers, besides the built-in ones (a group named v limits what is replaced; repeatable)")
	c.Flags().Var(&recLimit, "record-limit", "default bound of each sandbox's turn log recording (command output, LLM exchanges) that a recovery replays; past it turns are kept cut and cannot be fast-forwarded")
	eg.add(c)
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
				fmt.Printf("root %s, pool %s (%s free of %s, %s nodes)", h.Root, h.Pool.Dir, units.Bytes(int64(h.Pool.FreeBytes)), units.Bytes(int64(h.Pool.SizeBytes)), units.Bytes(int64(h.Pool.NodeSize)))
				if h.Pool.Loop {
					fmt.Printf(", loop file %s on %s", h.Pool.Backing, h.Pool.Device)
				}
				fmt.Printf("\n%d sandboxes; host key %s, %d keys trusted\n", h.Sandboxes, h.KeyID, len(h.TrustedKeys))
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

// sizeFlag is a positive size flag, as 256M.
type sizeFlag int64

func (f *sizeFlag) String() string {
	if n := int64(*f); n%(1<<20) == 0 {
		return fmt.Sprintf("%dM", n>>20)
	}
	return fmt.Sprint(int64(*f))
}
func (f *sizeFlag) Type() string { return "size" }
func (f *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil || n <= 0 {
		return fmt.Errorf("want a positive size such as 256M, not %q", v)
	}
	*f = sizeFlag(n)
	return nil
}

// egressFlags configure sandboxes' egress.
type egressFlags struct {
	rng, uplink, caFile string
	dns                 []string
	comp                compFlags
	// The TCP listener for tenants' tokens (not egress's, but the
	// daemon command's flags are kept short).
	listen string
	tls    daemon.TLSFiles
	kek    kekFlags
	ui     uiFlags
	store  storeFlags
}

// uiFlags are the web view's (docs/webui.md).
type uiFlags struct {
	addr, tokenFile string
	expose          bool
}

func (f *uiFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.addr, "ui", "", "serve the web view on HOST:PORT (off by default; loopback only unless --ui-expose): sandboxes, checkpoint trees, turn logs, effect ledgers, rollback/fork/delete/hibernate; the daemon logs its URL, which carries a random token (docs/webui.md)")
	c.Flags().BoolVar(&f.expose, "ui-expose", false, "allow a --ui address that is not loopback (the token then crosses the network in clear: put TLS in front)")
	c.Flags().StringVar(&f.tokenFile, "ui-token-file", "", "write the web view's URL, token included, to this file (mode 0600)")
}

func (eg *egressFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&eg.rng, "egress-range", egress.DefaultRange.String(), "addresses of sandboxes with --network egress (the first is their gateway and resolver, the last four the uplink link); molt's own router namespace holds them, so only the uplink's /30 shows on the host")
	c.Flags().StringVar(&eg.uplink, "egress-uplink", "", "network namespace (a name under /run/netns or a path) sandboxes' egress leaves through, instead of the host's default route (tests point it at a namespace of their own; docs/egress.md)")
	c.Flags().StringArrayVar(&eg.dns, "egress-dns", nil, "upstream resolver (ip or ip:port) of molt's DNS for sandboxes (repeatable; default: /etc/resolv.conf's nameservers)")
	eg.comp.add(c)
	c.Flags().StringVar(&eg.caFile, "egress-ca", "", "PEM file of extra roots the egress proxy trusts for the world's TLS when it inspects (a test internet's, a corporate proxy's)")
	c.Flags().StringVar(&eg.listen, "listen", "", "also serve the API on tcp://HOST:PORT over TLS to tenants' tokens (molt token create); the host admin stays on the socket")
	c.Flags().StringVar(&eg.tls.Cert, "tls-cert", "", "PEM certificate of --listen")
	c.Flags().StringVar(&eg.tls.Key, "tls-key", "", "PEM private key of --listen")
	c.Flags().StringVar(&eg.tls.ClientCA, "tls-client-ca", "", "PEM CA whose client certificates --listen requires (mutual TLS; default none)")
	eg.kek.add(c)
	eg.ui.add(c)
	eg.store.add(c)
}

// kekFlags give the key-encryption key that turns encryption at rest on
// (docs/security.md, "Encryption at rest").
type kekFlags struct{ file, env, previous string }

func (f *kekFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.file, "kek-file", "", "file of the 32-byte key-encryption key (raw, or 64 hex digits; mode 0600) that turns encryption at rest on: checkpoints' images, turn logs and ledgers are sealed with per-tenant data keys it wraps")
	c.Flags().StringVar(&f.env, "kek-env", "", "environment variable holding the key-encryption key (64 hex digits), instead of --kek-file")
	c.Flags().StringVar(&f.previous, "kek-previous-file", "", "the key-encryption key being rotated out: data keys it wraps are re-wrapped under the new one at start (no data is rewritten)")
}

// load returns the KEK and the previous one (nil if not given).
func (f *kekFlags) load() (kek, previous keys.KEK, err error) {
	switch {
	case f.file != "" && f.env != "":
		return nil, nil, fmt.Errorf("--kek-file and --kek-env: give one")
	case f.file != "":
		kek, err = keys.FileKEK(f.file)
	case f.env != "":
		kek, err = keys.EnvKEK(f.env)
	case f.previous != "":
		return nil, nil, fmt.Errorf("--kek-previous-file without a new key (--kek-file or --kek-env)")
	}
	if err != nil || f.previous == "" {
		return kek, nil, err
	}
	previous, err = keys.FileKEK(f.previous)
	return kek, previous, err
}

// compFlags bound the compensators rollbacks run (docs/egress.md).
type compFlags struct {
	attempts         int
	backoff, timeout time.Duration
}

func (f *compFlags) add(c *cobra.Command) {
	c.Flags().IntVar(&f.attempts, "compensate-attempts", core.DefaultCompensateAttempts, "attempts of each compensator a rollback runs before its compensation is reported failed")
	c.Flags().DurationVar(&f.backoff, "compensate-backoff", core.DefaultCompensateBackoff, "wait before a compensator's second attempt, doubled before each next one")
	c.Flags().DurationVar(&f.timeout, "compensate-timeout", core.DefaultCompensateTimeout, "bound of one attempt of a compensator (an HTTP request, a command in a helper sandbox)")
}
