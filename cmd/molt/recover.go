package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/molt-sh/molt/api/v1"
)

func recoverCmd(g *globals) *cobra.Command {
	var to string
	var force, dry, status bool
	c := &cobra.Command{
		Use:   "recover SANDBOX",
		Short: "Return a crashed agent's sandbox to its latest committed turn checkpoint and fast-forward the restarted agent from the turn log",
		Long: `recover rolls the sandbox back to the latest committed checkpoint taken at a
turn's end whose turns are all recorded (or --to CHECKPOINT). The agent,
restarted from scratch against the same LLM endpoint and exec API, is then
fast-forwarded: its LLM calls and commands up to that turn are answered from
the recorded turn log without running again, and from there on everything
runs live. The first request that differs from the record switches to live
and is reported (--status).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			ctx, cancel := ctx()
			defer cancel()
			if status {
				st, err := g.client().Recovery(ctx, args[0])
				if err != nil {
					return err
				}
				return g.print(st, func() { printRecovery(st) })
			}
			res, err := g.client().Recover(ctx, args[0], v1.RecoverRequest{To: to, Force: force, DryRun: dry})
			if err != nil {
				return err
			}
			defer func() {
				// As rollback: the world still has effects the sandbox
				// no longer has.
				if rb := res.Rollback; rb != nil && rb.Compensation != nil && rb.Compensation.State != v1.CompensationDone && err == nil {
					err = fmt.Errorf("%s recovered to %s, but %d compensation(s) failed or did not finish (molt effects %s)", res.Sandbox, res.Checkpoint, len(rb.Compensation.Failed), res.Sandbox)
				}
			}()
			return g.print(res, func() {
				verb := "recovered to"
				if res.DryRun {
					verb = "would recover to"
				}
				fmt.Printf("%s %s %s (turn %d)\n", res.Sandbox, verb, res.Checkpoint, res.Turn)
				fmt.Printf("fast-forward: %d LLM calls and %d commands from turns %s, %d bytes recorded\n",
					res.LLMCalls, res.Commands, turnList(res.Turns), res.Bytes)
				if rb := res.Rollback; rb != nil {
					if !res.DryRun {
						fmt.Printf("rollback: %.1f ms (%s)\n", rb.DurationMS, rb.Tier)
					}
					printRollbackRest(rb)
				}
			})
		},
	}
	c.Flags().StringVar(&to, "to", "", "checkpoint to recover to (one a turn's end took); default the latest committed one whose turns are all recorded")
	c.Flags().BoolVar(&force, "force", false, "recover even past effects others consumed that nothing compensates (as rollback --force)")
	c.Flags().BoolVar(&dry, "dry-run", false, "only print the recovery point, what the fast-forward holds and the rollback's plan")
	c.Flags().BoolVar(&status, "status", false, "print where the sandbox's fast-forward stands (replayed, diverged, done)")
	return c
}

func printRecovery(st v1.RecoveryStatus) {
	if st.State == v1.RecoveryNone {
		fmt.Printf("%s: no recovery under way\n", st.Sandbox)
		return
	}
	fmt.Printf("%s: %s (checkpoint %s, turn %d): %d of %d recorded exchanges replayed, %d bytes\n",
		st.Sandbox, st.State, st.Checkpoint, st.Turn, st.Replayed, st.Total, st.Bytes)
	if d := st.Divergence; d != nil {
		fmt.Printf("diverged at exchange %d (turn %d), live since:\n  expected: %s\n  got:      %s\n", d.Index, d.Turn, d.Expected, d.Got)
	}
}

// turnList prints turn numbers compactly: 1-7 9 12-13.
func turnList(ns []int) string {
	var parts []string
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ns[i], ns[j]))
		} else {
			parts = append(parts, fmt.Sprint(ns[i]))
		}
		i = j + 1
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}
