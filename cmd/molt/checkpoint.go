// Checkpoints: taking, inspecting, verifying and removing them, the tree
// of a sandbox's checkpoints, and rollback and fork from one.

package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/spf13/cobra"
)

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
			ctx, stop := withProgress(ctx, "checkpoint "+args[0])
			ck, err := g.client().Checkpoint(ctx, args[0], req)
			stop()
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
				if ck.DataKey != "" {
					fmt.Printf("sealed:   images encrypted with data key %s\n", ck.DataKey)
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
	var chain bool
	verify := &cobra.Command{
		Use: "verify CHECKPOINT [--chain]", Short: "Check a checkpoint's stored objects against its manifest (--chain: and every signed link of its lineage)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			if chain {
				res, err := g.client().VerifyChain(ctx, args[0])
				if err != nil {
					return err
				}
				if err := g.print(res, func() { printChain(res) }); err != nil {
					return err
				}
				if !res.OK {
					return &exitError{code: 1}
				}
				return nil
			}
			ck, err := g.client().VerifyCheckpoint(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(ck, func() { fmt.Printf("%s: ok\n", ck.ID) })
		},
	}
	verify.Flags().BoolVar(&chain, "chain", false, "also verify the lineage up to its root: each manifest signed by a trusted key, naming its parent and the parent's digest")
	c.AddCommand(rm, inspect, verify, checkpointExportCmd(g), checkpointImportCmd(g))
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
	var force, dry bool
	c := &cobra.Command{
		Use: "rollback SANDBOX CHECKPOINT", Short: "Return a sandbox to a checkpoint", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			ctx, cancel := ctx()
			defer cancel()
			res, err := g.client().RollbackWith(ctx, args[0], v1.RollbackRequest{Checkpoint: args[1], Tier: tier, Force: force, DryRun: dry})
			if err != nil {
				return err
			}
			defer func() {
				// Rolled back, but the world still has effects it
				// should no longer have: a failure, whatever the output.
				if c := res.Compensation; c != nil && c.State != v1.CompensationDone && err == nil {
					err = fmt.Errorf("%s rolled back to %s, but %d compensation(s) failed or did not finish (molt effects %s)", res.Sandbox, res.Checkpoint, len(c.Failed), res.Sandbox)
				}
			}()
			return g.print(res, func() {
				if !dry {
					fmt.Printf("%s rolled back to %s in %.1f ms (%s)\n", res.Sandbox, res.Checkpoint, res.DurationMS, res.Tier)
				}
				printRollbackRest(&res)
			})
		},
	}
	c.Flags().StringVar(&tier, "tier", "", "hot, warm (restore from the images even with a standby ready) or cold (also rehash every object first); default the fastest available")
	c.Flags().BoolVar(&force, "force", false, "roll back even past effects others consumed that nothing compensates (otherwise refused: conflict)")
	c.Flags().BoolVar(&dry, "dry-run", false, "only print what the rollback would orphan, replay, compensate or block")
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
			ctx, stop := withProgress(ctx, "fork "+args[0])
			res, err := g.client().ForkWith(ctx, args[0], v1.ForkRequest{N: n, Reseed: reseed})
			stop()
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

// captureNote is why a full checkpoint copied its memory frozen, if it
// says, as " (why)".
func captureNote(ck v1.Checkpoint) string {
	if ck.CaptureNote == "" {
		return ""
	}
	return " (" + ck.CaptureNote + ")"
}

func printChain(res v1.ChainVerification) {
	for i, l := range res.Links {
		state := "ok"
		if l.Problem != "" {
			state = "BROKEN: " + l.Problem
		}
		key := l.Key
		if key == "" {
			key = "unsigned"
		}
		fmt.Printf("%s%s  %s  %s\n", strings.Repeat("  ", i), l.ID, key, state)
	}
	if res.OK {
		fmt.Printf("lineage of %s: %d checkpoints, every link signed and intact (host key %s)\n", res.Checkpoint, len(res.Links), res.Key)
	} else {
		fmt.Printf("lineage of %s: BROKEN\n", res.Checkpoint)
	}
}
