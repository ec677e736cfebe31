package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/spf13/cobra"
)

func turnCmd(g *globals) *cobra.Command {
	var ignore []string
	var label string
	var dry bool
	c := &cobra.Command{
		Use:   "turn SANDBOX",
		Short: "End the sandbox's current turn: checkpoint what it changed (none, fs or full) and start the next",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			res, err := g.client().EndTurn(ctx, args[0], v1.TurnRequest{Ignore: ignore, Label: label, DryRun: dry})
			if err != nil {
				return err
			}
			return g.print(res, func() { printTurn(res) })
		},
	}
	c.Flags().StringArrayVar(&ignore, "ignore", nil, "path pattern whose changes do not matter for recovery, as /tmp/** or **/__pycache__/** (repeatable)")
	c.Flags().StringVar(&label, "label", "", "label for the checkpoint, if one is taken")
	c.Flags().BoolVar(&dry, "dry-run", false, "show what the turn did and the decision, without checkpointing or ending it")
	return c
}

func printTurn(res v1.TurnResult) {
	ck := "-"
	if res.Checkpoint != nil {
		ck = *res.Checkpoint
		if res.Pending {
			ck += " (pending)"
		}
	}
	fmt.Printf("turn %d: %s  checkpoint %s  decide %.2f ms  stall %.2f ms  total %.2f ms\n",
		res.Turn, res.Decision, ck, res.DecideMS, res.StallMS, res.DurationMS)
	for _, r := range res.Reasons {
		fmt.Printf("  because %s\n", r)
	}
	e := res.Effects
	for _, f := range e.Files {
		fmt.Printf("  file    %-40s %s\n", f.Path, strings.Join(f.Ops, ","))
	}
	for _, p := range e.Processes {
		fmt.Printf("  process %-6s %d %s %s\n", p.Op, p.Pid, p.Comm, p.Path)
	}
	for _, s := range e.Sockets {
		fmt.Printf("  socket  %-7s %s %s (pid %d)\n", s.Op, s.Family, s.Addr, s.Pid)
	}
	if e.IgnoredFiles > 0 {
		fmt.Printf("  (%d file effects ignored)\n", e.IgnoredFiles)
	}
}

func turnsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "turns SANDBOX",
		Short: "Show the sandbox's turn log: decisions, checkpoints, commands and LLM calls",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().Turns(ctx, args[0])
			if err != nil {
				return err
			}
			return g.print(l, func() {
				fmt.Printf("%-5s %-8s %-14s %-6s %-6s %s\n", "TURN", "DECISION", "CHECKPOINT", "CMDS", "LLM", "ENDED")
				for _, t := range l {
					ck := "-"
					if t.Checkpoint != nil {
						ck = *t.Checkpoint
					}
					fmt.Printf("%-5d %-8s %-14s %-6d %-6d %s\n", t.Turn, t.Decision, ck, len(t.Commands), len(t.LLM), t.Ended.Format("15:04:05.000"))
				}
			})
		},
	}
}

func llmCmd(g *globals) *cobra.Command {
	var req v1.LLMEndpointRequest
	var header []string
	c := &cobra.Command{
		Use:   "llm SANDBOX --upstream URL",
		Short: "Give the sandbox an LLM endpoint: calls through it end the agent's turn and checkpoint it; prints the base URL",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			var err error
			if req.Header, err = readHeaders(header, cmd.InOrStdin()); err != nil {
				return err
			}
			ep, err := g.client().SetLLM(ctx, args[0], req)
			if err != nil {
				return err
			}
			return g.print(ep, func() { fmt.Println(ep.URL) })
		},
	}
	c.Flags().StringVar(&req.Upstream, "upstream", "", "the LLM API base URL to forward to (OpenAI- or Anthropic-compatible)")
	c.Flags().StringVar(&req.Listen, "listen", "", "host address to serve on (default 127.0.0.1, any port); must be loopback unless --expose")
	c.Flags().BoolVar(&req.Expose, "expose", false, "allow a --listen address that is not loopback: whoever reaches it can spend the credentials of --header")
	c.Flags().StringVar(&req.Gate, "gate", "response", "hold the LLM's reply until the turn's checkpoint is captured (response), or let it go and hold the next command (exec)")
	c.Flags().StringArrayVar(&header, "header", nil, "header set on upstream requests, as 'Authorization: Bearer ...' (repeatable); @FILE reads 'Name: value' lines from FILE and @- from stdin, keeping secrets out of the command line")
	c.Flags().StringArrayVar(&req.Ignore, "ignore", nil, "path pattern whose changes do not matter for recovery (repeatable)")
	_ = c.MarkFlagRequired("upstream")
	rm := &cobra.Command{
		Use: "rm SANDBOX", Short: "Close the sandbox's LLM endpoint", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return g.client().RemoveLLM(ctx, args[0])
		},
	}
	c.AddCommand(rm)
	return c
}

// readHeaders parses --header values: "Name: value", or "@FILE" (or "@-"
// for stdin) naming lines of them, so that a key need not appear in argv
// (readable by every user in /proc/PID/cmdline).
func readHeaders(args []string, stdin io.Reader) (map[string]string, error) {
	out := map[string]string{}
	add := func(h, from string) error {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			if from != "" {
				return fmt.Errorf("--header %s: a line is not 'Name: value'", from)
			}
			return fmt.Errorf("--header %q: want Name: value, or @FILE", h)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		return nil
	}
	for _, h := range args {
		name, ok := strings.CutPrefix(h, "@")
		if !ok {
			if err := add(h, ""); err != nil {
				return nil, err
			}
			continue
		}
		var b []byte
		var err error
		if name == "-" {
			b, err = io.ReadAll(io.LimitReader(stdin, 1<<20))
		} else {
			b, err = os.ReadFile(name)
		}
		if err != nil {
			return nil, fmt.Errorf("--header %s: %w", h, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := add(line, h); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
