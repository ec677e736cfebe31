package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/molt-sh/molt/internal/bench"
)

// benchEgressCmd is molt bench egress: requests through molt's egress
// proxy next to the same requests by NAT alone, unrecorded.
func benchEgressCmd(g *globals) *cobra.Command {
	var requests, rounds int
	var size, dir string
	c := &cobra.Command{
		Use:   "egress",
		Short: "Egress request latency and throughput through molt's proxy vs direct NAT without recording (HTTP, HTTPS, HTTPS inspected)",
		Long: "Starts a test internet (a network namespace with web servers, as the tests use), a ledger in a\n" +
			"temporary directory under --dir, and molt's egress router with three fake sandboxes: one recorded\n" +
			"through the proxy, one whose HTTPS the proxy inspects, and one whose TCP is forwarded by NAT alone\n" +
			"(the baseline: the same veth, router namespace and NAT, without the proxy and the ledger). Each\n" +
			"workload runs through molt and directly in alternating rounds. No daemon is started. Needs root.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return errors.New("molt bench egress needs root: it creates network namespaces, veths and nftables rules")
			}
			n, err := parseSize(size)
			if err != nil {
				return err
			}
			ctx, cancel := ctx()
			defer cancel()
			res, err := bench.RunEgress(ctx, bench.EgressConfig{Requests: requests, Bytes: n, Rounds: rounds, Dir: dir, Progress: os.Stderr})
			if err != nil {
				return err
			}
			return g.print(res, func() {
				fmt.Printf("molt bench egress: %d requests per latency workload and method, %s per transfer, %d rounds\n", requests, size, rounds)
				bench.PrintEgress(os.Stdout, res)
			})
		},
	}
	c.Flags().IntVar(&requests, "requests", 1000, "latency samples per workload and method")
	c.Flags().StringVar(&size, "bytes", "64M", "size of one throughput transfer")
	c.Flags().IntVar(&rounds, "rounds", 6, "rounds alternating the methods")
	c.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary ledger directory goes")
	return c
}
