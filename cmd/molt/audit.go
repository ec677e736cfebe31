package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/audit"
	"github.com/molt-sh/molt/internal/httpapi"
)

func auditCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "audit",
		Short: "Export and verify the daemon's hash-chained audit log (every API request and effect)",
	}
	c.AddCommand(auditExportCmd(g), auditVerifyCmd(g))
	return c
}

func auditExportCmd(g *globals) *cobra.Command {
	var since uint64
	var out string
	c := &cobra.Command{
		Use:   "export",
		Short: "Write the audit log's entries (JSON lines, as the log holds them) to stdout or --out",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			var w io.Writer = os.Stdout
			if out != "" {
				f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if err := g.client().AuditExport(ctx, since, w); err != nil {
				return err
			}
			if f, ok := w.(*os.File); ok && out != "" {
				return f.Sync()
			}
			return nil
		},
	}
	c.Flags().Uint64Var(&since, "since", 0, "only the entries after this seq")
	c.Flags().StringVar(&out, "out", "", "write to this file (mode 0600) instead of stdout")
	return c
}

func auditVerifyCmd(g *globals) *cobra.Command {
	var anchor, anchorFile string
	c := &cobra.Command{
		Use:   "verify [FILE]",
		Short: "Verify the daemon's audit log, or an exported FILE offline: any edit, deletion, reordering, and a cut tail against the anchor",
		Long: `Without FILE the daemon verifies its log against its anchor. With FILE
(an export, or the daemon's audit.log itself) the check runs here, without a
daemon: against --anchor SEQ:HASH (a head printed by an earlier verify) or
--anchor-file (the daemon's audit.anchor); without either, a cut tail cannot be
told from a short log. Exits 1 when the log does not verify.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res v1.AuditVerifyResult
			if len(args) == 0 {
				if anchor != "" || anchorFile != "" {
					return errors.New("--anchor and --anchor-file go with a FILE; the daemon checks its own anchor")
				}
				ctx, cancel := ctx()
				defer cancel()
				r, err := g.client().AuditVerify(ctx)
				if err != nil {
					return err
				}
				res = r
			} else {
				r, err := verifyFile(args[0], anchor, anchorFile)
				if err != nil {
					return err
				}
				res = r
			}
			if err := g.print(res, func() { printAuditVerify(res) }); err != nil {
				return err
			}
			if !res.OK {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	c.Flags().StringVar(&anchor, "anchor", "", "SEQ:HASH the log must hold (offline verification of FILE)")
	c.Flags().StringVar(&anchorFile, "anchor-file", "", "the daemon's anchor file (<root>/audit/audit.anchor) to check FILE against")
	return c
}

func verifyFile(path, anchor, anchorFile string) (v1.AuditVerifyResult, error) {
	var a *audit.Head
	switch {
	case anchor != "" && anchorFile != "":
		return v1.AuditVerifyResult{}, errors.New("give --anchor or --anchor-file, not both")
	case anchor != "":
		s, h, ok := strings.Cut(anchor, ":")
		seq, err := strconv.ParseUint(s, 10, 64)
		if !ok || err != nil || len(h) != 64 {
			return v1.AuditVerifyResult{}, fmt.Errorf("--anchor %q: want SEQ:HASH (64 hex digits)", anchor)
		}
		a = &audit.Head{Seq: seq, Hash: strings.ToLower(h)}
	case anchorFile != "":
		h, err := audit.ReadAnchorFile(anchorFile)
		if err != nil {
			return v1.AuditVerifyResult{}, err
		}
		a = &h
	}
	f, err := os.Open(path)
	if err != nil {
		return v1.AuditVerifyResult{}, err
	}
	defer f.Close()
	res := httpapi.AuditResult(audit.Verify(f, a))
	if abs, err := filepath.Abs(path); err == nil {
		res.File = abs
	}
	return res, nil
}

func printAuditVerify(r v1.AuditVerifyResult) {
	span := "none"
	if r.Entries > 0 {
		span = fmt.Sprintf("seq %d-%d", r.FirstSeq, r.Head.Seq)
	}
	if r.OK {
		fmt.Printf("ok: %d entries (%s) in %s\nhead %d:%s\n", r.Entries, span, r.File, r.Head.Seq, r.Head.Hash)
	} else {
		where := fmt.Sprintf("seq %d", r.BadSeq)
		if r.BadLine > 0 {
			where += fmt.Sprintf(" (line %d)", r.BadLine)
		}
		fmt.Printf("FAILED at %s: %s\n", where, r.Problem)
		fmt.Printf("before it: %d good entries (%s) in %s, last good %d:%s\n", r.Entries, span, r.File, r.Head.Seq, r.Head.Hash)
	}
	if r.Anchor != nil {
		fmt.Printf("anchor %d:%s\n", r.Anchor.Seq, r.Anchor.Hash)
	} else {
		fmt.Println("no anchor: a cut tail is not detected (give --anchor or --anchor-file)")
	}
	if r.Partial {
		fmt.Printf("partial: the entries start at seq %d; the chain is checked from there\n", r.FirstSeq)
	}
	if r.Segment != "" {
		fmt.Printf("segment: %s\n", r.Segment)
	}
}
