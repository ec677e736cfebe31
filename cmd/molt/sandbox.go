// The sandbox lifecycle verbs: create, ls, inspect, rm, stop, start,
// hibernate and resume.

package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/units"
	"github.com/spf13/cobra"
)

func createCmd(g *globals) *cobra.Command {
	var name, hostname, memory, pids, cpus, standbyBudget, disk, filter string
	var env, secrets, secretEnv []string
	var net netFlags
	var ioWeight int64
	var recordLimit string
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
			sec, err := parseSecrets(secrets, secretEnv)
			if err != nil {
				return err
			}
			req := v1.SandboxCreateRequest{Image: args[0], Name: name, Hostname: hostname, Env: e, Secrets: sec,
				Resources: v1.Resources{MemoryBytes: res.MemoryBytes, Pids: res.Pids, CPUMillis: res.CPUMillis, IOWeight: res.IOWeight, StandbyBudgetBytes: sby, DiskBytes: diskBytes}}
			if req.Seccomp, req.SeccompProfile, err = seccompFlag(filter); err != nil {
				return err
			}
			if req.Network, req.Egress, err = net.request(); err != nil {
				return err
			}
			if recordLimit != "" {
				if req.RecordLimit, err = parseSize(recordLimit); err != nil || req.RecordLimit <= 0 {
					return fmt.Errorf("bad --record-limit %q: want a size such as 64M", recordLimit)
				}
			}
			if req.EffectPolicy, err = net.policy(); err != nil {
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
	c.Flags().StringVar(&recordLimit, "record-limit", "", "bound of the turn log's recording (command output, LLM exchanges) a recovery replays (e.g. 64M; default: the daemon's --record-limit)")
	c.Flags().StringVar(&hostname, "hostname", "", "hostname (default: the name, or molt-ID)")
	c.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE for every command (repeatable)")
	c.Flags().StringArrayVar(&secrets, "secret", nil, "secret NAME=@FILE: an environment variable for every command whose value is read from FILE here, sent once, stored only sealed, never shown and redacted from turn logs and ledgers (repeatable)")
	c.Flags().StringArrayVar(&secretEnv, "secret-env", nil, "secret NAME taken from this command's own environment variable NAME, as --secret (repeatable)")
	c.Flags().StringVar(&memory, "memory", "", "memory limit (e.g. 2G; 0 or unlimited for none; default: the daemon's --default-memory)")
	c.Flags().StringVar(&pids, "pids", "", "process (task) limit (0 or unlimited for none; default: the daemon's --default-pids)")
	c.Flags().StringVar(&cpus, "cpus", "", "CPU limit in CPUs, as 1.5 (0 or unlimited for none; default: the daemon's --default-cpus)")
	c.Flags().Int64Var(&ioWeight, "io-weight", 0, "proportional block I/O weight, 1-10000 on cgroup v2 and 1-1000 on v1 (0: the kernel's default, 100); refused where the host has no weight file")
	c.Flags().StringVar(&disk, "disk", "", "disk quota: the sandbox's files and its checkpoints' together, past which its writes fail with EDQUOT (e.g. 10G; none for no quota; default: the daemon's --default-disk)")
	c.Flags().StringVar(&standbyBudget, "standby-budget", "", "memory for this sandbox's standbys (hot rollback), within the host's (e.g. 512M; 0 for none; default: the daemon's --sandbox-standby-budget)")
	net.add(c)
	c.Flags().StringVar(&filter, "seccomp", "", "system call filter: default (molt's profile, docs/security.md), unconfined, or the path of a Docker/OCI-format JSON profile, read here and sent to the daemon (default: the daemon's --seccomp-default)")
	return c
}

// maxSecretBytes bounds one secret read from a file.
const maxSecretBytes = 1 << 20

// parseSecrets reads --secret NAME=@FILE and --secret-env NAME. A value
// is never taken from the command line itself: argv is readable by every
// user of the host.
func parseSecrets(files, envs []string) (map[string]string, error) {
	if len(files)+len(envs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range files {
		k, f, ok := strings.Cut(kv, "=")
		if !ok || k == "" || !strings.HasPrefix(f, "@") || len(f) < 2 {
			return nil, fmt.Errorf("bad --secret %q: want NAME=@FILE (the value is read from FILE, never given on the command line)", k)
		}
		b, err := os.ReadFile(f[1:])
		if err != nil {
			return nil, fmt.Errorf("--secret %s: %w", k, err)
		}
		if len(b) > maxSecretBytes {
			return nil, fmt.Errorf("--secret %s: %s holds more than %d bytes", k, f[1:], maxSecretBytes)
		}
		out[k] = strings.TrimRight(string(b), "\r\n")
	}
	for _, k := range envs {
		v, ok := os.LookupEnv(k)
		if k == "" || !ok {
			return nil, fmt.Errorf("--secret-env %s: not in the environment", k)
		}
		out[k] = v
	}
	return out, nil
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
				fmt.Printf("limits:    memory %s, pids %s, cpus %s", showLimit(r.MemoryBytes, units.Bytes), showLimit(r.Pids, func(v int64) string { return strconv.FormatInt(v, 10) }),
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
					fmt.Printf("init pid:  %d\nprocesses: %d\nmemory:    %s\n", sb.Pid, sb.Processes, units.Bytes(sb.MemoryBytes))
					if len(sb.Standbys) > 0 {
						fmt.Printf("standbys:  %s (%s)\n", strings.Join(sb.Standbys, ", "), units.Bytes(sb.StandbyBytes))
					}
				}
				if sb.Resources.DiskBytes > 0 {
					fmt.Printf("disk:      %s of %s\n", units.Bytes(sb.DiskUsedBytes), units.Bytes(sb.Resources.DiskBytes))
				} else if sb.DiskUsedBytes > 0 {
					fmt.Printf("disk:      %s (no quota)\n", units.Bytes(sb.DiskUsedBytes))
				}
				if len(sb.EnvNames) > 0 {
					fmt.Printf("env:       %s\n", strings.Join(sb.EnvNames, ", "))
				}
				if len(sb.Secrets) > 0 {
					fmt.Printf("secrets:   %s\n", strings.Join(sb.Secrets, ", "))
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

func hibernateCmd(g *globals) *cobra.Command {
	var offload bool
	c := &cobra.Command{
		Use: "hibernate SANDBOX", Short: "Checkpoint a sandbox fully and stop it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			ctx, stop := withProgress(ctx, "hibernate "+args[0])
			var sb v1.Sandbox
			var err error
			if offload {
				sb, err = g.client().HibernateOffload(ctx, args[0])
			} else {
				sb, err = g.client().Hibernate(ctx, args[0])
			}
			stop()
			if err != nil {
				return err
			}
			return g.print(sb, func() {
				if sb.Offloaded {
					fmt.Println(sb.ID, sb.State, "offloaded")
				} else {
					fmt.Println(sb.ID, sb.State)
				}
			})
		},
	}
	c.Flags().BoolVar(&offload, "offload", false, "then upload the checkpoint to the daemon's object store and free its local copy (resume anywhere that shares the store)")
	return c
}

func resumeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "resume SANDBOX", Short: "Resume a hibernated sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			ctx, stop := withProgress(ctx, "resume "+args[0])
			sb, err := g.client().Resume(ctx, args[0])
			stop()
			if err != nil {
				return err
			}
			return g.print(sb, func() { fmt.Println(sb.ID, sb.State) })
		},
	}
}

func migrateCmd(g *globals) *cobra.Command {
	var to, token, tokenFile, caFile string
	c := &cobra.Command{
		Use:   "migrate SANDBOX --to https://HOST:PORT",
		Short: "Move a running sandbox to another daemon sharing the object store",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := v1.MigrateRequest{To: to, Token: token}
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("--to-token-file: %w", err)
				}
				req.Token = strings.TrimSpace(string(b))
			}
			if caFile != "" {
				b, err := os.ReadFile(caFile)
				if err != nil {
					return fmt.Errorf("--to-ca: %w", err)
				}
				req.CAPEM = string(b)
			}
			ctx, cancel := ctx()
			defer cancel()
			ctx, stop := withProgress(ctx, "migrate "+args[0])
			res, err := g.client().Migrate(ctx, args[0], req)
			stop()
			if err != nil {
				return err
			}
			return g.print(res, func() {
				fmt.Printf("%s migrated to %s at checkpoint %s (%d checkpoints there), down %.0f ms\n", res.Sandbox, res.Target, res.Checkpoint, res.Checkpoints, res.DowntimeMS)
				if res.PrecopyMS > 0 {
					fmt.Printf("memory sent ahead while it ran: %s in %.0f ms\n", units.Bytes(res.PrecopySentBytes), res.PrecopyMS)
				}
				if res.LLMEndpoint != nil {
					fmt.Printf("its LLM endpoint there (same token): %s\n", res.LLMEndpoint.URL)
				}
				if res.Note != "" {
					fmt.Println("note:", res.Note)
				}
			})
		},
	}
	c.Flags().StringVar(&to, "to", "", "the target daemon's TCP API, https://HOST:PORT (its --listen); it must share this daemon's --store and trust its host key")
	c.Flags().StringVar(&token, "to-token", os.Getenv("MOLT_TO_TOKEN"), "a token of the sandbox's tenant on the target, with the checkpoint scope, or admin to move the sandbox's LLM endpoint too (env MOLT_TO_TOKEN)")
	c.Flags().StringVar(&tokenFile, "to-token-file", "", "read --to-token from this file")
	c.Flags().StringVar(&caFile, "to-ca", "", "PEM file of the CA that signed the target's certificate (default the system's roots)")
	_ = c.MarkFlagRequired("to")
	return c
}

func storeCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "store", Short: "The daemon's object store (molt daemon --store)"}
	var grace time.Duration
	var dry bool
	gc := &cobra.Command{
		Use:   "gc",
		Short: "Delete what nothing in the object store names any more, a grace period after a run first finds it so",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req := v1.StoreGCRequest{GraceSeconds: int64(grace / time.Second), DryRun: dry}
			ctx, cancel := ctx()
			defer cancel()
			rep, err := g.client().StoreGC(ctx, req)
			if err != nil {
				return err
			}
			return g.print(rep, func() {
				verb := "deleted"
				if rep.DryRun {
					verb = "would delete"
				}
				fmt.Printf("run %d: %d recipes, %d sandboxes, %d packs; %s %d packs and %d histories (%s); %d newly condemned, %d waiting out the grace period, %d named again\n",
					rep.Generation, rep.Recipes, rep.Sandboxes, rep.Packs, verb, rep.DeletedPacks, rep.DeletedHistory, units.Bytes(rep.DeletedBytes), rep.Condemned, rep.Waiting, rep.Revived)
			})
		},
	}
	gc.Flags().DurationVar(&grace, "grace", v1.DefaultStoreGCGrace, "how long what nothing names is kept after a run first finds it so (at least 1m; every upload must finish within it)")
	gc.Flags().BoolVar(&dry, "dry-run", false, "report what would be deleted, and change nothing")
	c.AddCommand(gc, storeTrustCmd(g))
	return c
}

func storeTrustCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "trust HOST.PUB",
		Short: "Trust another host's key (its host.pub, or - for standard input): the sandboxes and checkpoints it put in the store resume here",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var b []byte
			var err error
			if args[0] == "-" {
				b, err = io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
			} else {
				b, err = os.ReadFile(args[0])
			}
			if err != nil {
				return err
			}
			ctx, cancel := ctx()
			defer cancel()
			k, err := g.client().TrustKey(ctx, string(b))
			if err != nil {
				return err
			}
			return g.print(k, func() {
				if k.Added {
					fmt.Printf("trusting %s\n", k.KeyID)
				} else {
					fmt.Printf("%s was trusted already\n", k.KeyID)
				}
			})
		},
	}
}
