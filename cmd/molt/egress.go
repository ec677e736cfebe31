package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/molt-sh/molt/api/v1"
)

// netFlags are molt create's network flags.
type netFlags struct {
	network          string
	allow, deny      []string
	httpPorts        []uint
	inspect          bool
	onDivergence     string
	ignoreHeaders    []string
	ignoreJSONFields []string
	effectPolicy     []string
}

func (n *netFlags) add(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&n.network, "network", "none", "none (loopback only) or egress (a way out through molt's proxy, every effect in the ledger: docs/egress.md)")
	f.StringArrayVar(&n.allow, "allow", nil, "with --network egress: a domain (example.com, its subdomains too) or CIDR the sandbox may reach; with any, nothing else (repeatable)")
	f.StringArrayVar(&n.deny, "deny", nil, "with --network egress: a domain or CIDR the sandbox may not reach (repeatable; private ranges, the host and link-local addresses are denied unless --allow names them)")
	f.UintSliceVar(&n.httpPorts, "egress-http-port", nil, "with --network egress: a port beyond 80 whose TCP is parsed and recorded as HTTP (repeatable)")
	f.BoolVar(&n.inspect, "egress-inspect", false, "with --network egress: terminate TLS with a CA of the sandbox's own (installed in its trust store) and record HTTPS requests like HTTP ones")
	f.StringVar(&n.onDivergence, "on-divergence", "forward", "with --network egress: after a rollback, what happens to an effect the ledger has no record of while recorded ones are still to be replayed: forward (send it) or block (refuse it)")
	f.StringArrayVar(&n.ignoreHeaders, "egress-ignore-header", nil, "with --network egress: a request header left out when comparing requests for replay (repeatable)")
	f.StringArrayVar(&n.effectPolicy, "effect-policy", nil, "KIND=POLICY: what a rollback that would orphan a committed effect of KIND (http, opaque, declared, a declared effect's type, or *) does: refuse (the rollback, unless --force), compensate (run its compensator; none blocks) or allow (orphan it); repeatable; default: compensate when it has a compensator, refuse when others consumed it, else allow")
	f.StringArrayVar(&n.ignoreJSONFields, "egress-ignore-json-field", nil, "with --network egress: a JSON field left out when comparing request bodies for replay, at any depth (repeatable)")
}

func (n *netFlags) request() (string, *v1.EgressPolicy, error) {
	switch n.network {
	case v1.NetworkNone, "":
		if len(n.allow)+len(n.deny)+len(n.httpPorts) > 0 || n.inspect {
			return "", nil, fmt.Errorf("--allow, --deny, --egress-http-port and --egress-inspect need --network egress")
		}
		return "", nil, nil
	case v1.NetworkEgress:
	default:
		return "", nil, fmt.Errorf("--network %q: want none or egress", n.network)
	}
	p := &v1.EgressPolicy{Inspect: n.inspect, OnDivergence: n.onDivergence, IgnoreHeaders: n.ignoreHeaders, IgnoreJSONFields: n.ignoreJSONFields}
	for _, port := range n.httpPorts {
		if port == 0 || port > 65535 {
			return "", nil, fmt.Errorf("--egress-http-port %d: want 1-65535", port)
		}
		p.HTTPPorts = append(p.HTTPPorts, uint16(port))
	}
	for _, a := range n.allow {
		if isCIDR(a) {
			p.AllowCIDRs = append(p.AllowCIDRs, a)
		} else {
			p.AllowDomains = append(p.AllowDomains, a)
		}
	}
	for _, d := range n.deny {
		if isCIDR(d) {
			p.DenyCIDRs = append(p.DenyCIDRs, d)
		} else {
			p.DenyDomains = append(p.DenyDomains, d)
		}
	}
	return v1.NetworkEgress, p, nil
}

// policy returns --effect-policy as a map.
func (n *netFlags) policy() (map[string]string, error) {
	if len(n.effectPolicy) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range n.effectPolicy {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--effect-policy %q: want KIND=refuse|compensate|allow", kv)
		}
		out[strings.ToLower(k)] = v
	}
	return out, nil
}

// isCIDR tells addresses and prefixes from domain names.
func isCIDR(s string) bool {
	return strings.Contains(s, "/") || strings.Trim(s, "0123456789.") == "" || strings.Contains(s, ":")
}

func effectsCmd(g *globals) *cobra.Command {
	var since string
	c := &cobra.Command{
		Use:   "effects SANDBOX",
		Short: "Show the sandbox's effect ledger: what left it (HTTP requests, connections, DNS lookups) and what was declared",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().Effects(ctx, args[0], since)
			if err != nil {
				return err
			}
			return g.print(l, func() {
				fmt.Printf("%-16s %-5s %-7s %-9s %-6s %-6s %s\n", "ID", "TURN", "KIND", "STATE", "PROTO", "STATUS", "REQUEST")
				for _, e := range l {
					what := strings.TrimSpace(e.Method + " " + e.URL)
					if e.URL == "" {
						what = strings.TrimSpace(e.Method + " " + e.Host + " " + e.Addr)
					}
					state := e.State
					if e.Orphan {
						state += "*"
					}
					status := "-"
					if e.Status != 0 {
						status = fmt.Sprint(e.Status)
					}
					fmt.Printf("%-16s %-5d %-7s %-9s %-6s %-6s %s", e.ID, e.Turn, e.Kind, state, e.Proto, status, what)
					if e.ReplayOf != "" {
						fmt.Printf(" (of %s)", e.ReplayOf)
					}
					if e.Error != "" {
						fmt.Printf(" [%s]", e.Error)
					}
					if c := e.Compensation; c != nil {
						switch c.State {
						case "failed":
							fmt.Printf(" compensation FAILED: %s", c.Error)
						case "compensated":
							fmt.Printf(" COMPENSATED (%d attempt(s))", c.Attempts)
						default:
							fmt.Printf(" compensation %s (attempt %d)", c.State, c.Attempts)
						}
					}
					if !e.Finished.IsZero() {
						fmt.Printf(" %s", e.Finished.Sub(e.Started).Round(time.Microsecond))
					}
					fmt.Println()
				}
				fmt.Println("* orphan: the world has it, the sandbox's state does not (rolled back past it)")
			})
		},
	}
	c.Flags().StringVar(&since, "since", "", "only what was recorded after this checkpoint (ID or label)")
	return c
}

// printPlan prints what a rollback does (or would do) to the effects.
func printPlan(p *v1.RollbackPlan) {
	if p == nil {
		return
	}
	if p.DryRun {
		fmt.Println("dry run: nothing was done")
	}
	fmt.Printf("orphaned effects (the world keeps them): %d %s\n", len(p.Orphan), strings.Join(p.Orphan, " "))
	fmt.Printf("  answered from the ledger if asked again: %d %s\n", len(p.Replay), strings.Join(p.Replay, " "))
	fmt.Printf("  with a compensator: %d %s\n", len(p.Compensate), strings.Join(p.Compensate, " "))
	fmt.Printf("  blocking the rollback unless --force: %d\n", len(p.Block))
	for _, b := range p.Block {
		fmt.Printf("    %s %s %s", b.ID, b.Method, b.URL)
		if len(b.Consumers) > 0 {
			fmt.Printf(" consumed by %s", strings.Join(b.Consumers, ", "))
		}
		if b.Reason != "" {
			fmt.Printf(" (%s)", b.Reason)
		}
		fmt.Println()
	}
	if len(p.Decisions) > 0 {
		fmt.Println("  the effect policy's decisions:")
		for _, d := range p.Decisions {
			pol := "default"
			if d.Policy != "" {
				pol = d.Kind + "=" + d.Policy
			}
			fmt.Printf("    %s %-10s by %s\n", d.ID, d.Action, pol)
		}
	}
}

// printCompensation prints how a rollback's compensations went.
func printCompensation(c *v1.CompensationReport) {
	if c == nil {
		return
	}
	fmt.Printf("compensations: %s; compensated %d %s\n", c.State, len(c.Compensated), strings.Join(c.Compensated, " "))
	for _, f := range c.Failed {
		fmt.Printf("  FAILED %s after %d attempt(s): %s\n", f.ID, f.Attempts, f.Error)
	}
}

func compensatorCmd(g *globals) *cobra.Command {
	var method, in, body string
	var headers []string
	c := &cobra.Command{
		Use:   "compensator EFFECT (--http METHOD URL [--header K:V] [--body B] | --in SANDBOX -- COMMAND...)",
		Short: "Give a recorded effect a compensator, which a rollback that orphans it runs (an HTTP request, or a command in a helper sandbox)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var comp v1.Compensator
			switch {
			case method != "" && in != "":
				return fmt.Errorf("--http and --in: give one")
			case method != "":
				if len(args) != 2 {
					return fmt.Errorf("--http METHOD URL: want the URL after the effect")
				}
				comp = v1.Compensator{Method: method, URL: args[1], Body: []byte(body)}
				for _, h := range headers {
					k, v, ok := strings.Cut(h, ":")
					if !ok {
						return fmt.Errorf("--header %q: want K:V", h)
					}
					if comp.Header == nil {
						comp.Header = map[string][]string{}
					}
					comp.Header[strings.TrimSpace(k)] = append(comp.Header[strings.TrimSpace(k)], strings.TrimSpace(v))
				}
			case in != "":
				if len(args) < 2 {
					return fmt.Errorf("--in SANDBOX -- COMMAND...: no command")
				}
				comp = v1.Compensator{Sandbox: in, Command: args[1:]}
			default:
				return fmt.Errorf("want --http METHOD URL or --in SANDBOX -- COMMAND")
			}
			ctx, cancel := ctx()
			defer cancel()
			e, err := g.client().SetCompensator(ctx, args[0], comp)
			if err != nil {
				return err
			}
			return g.print(e, func() { fmt.Printf("%s has a compensator\n", e.ID) })
		},
	}
	c.Flags().StringVar(&method, "http", "", "the compensator is an HTTP request of this method to the URL given after the effect (sent with Idempotency-Key: molt-compensate-EFFECT)")
	c.Flags().StringArrayVar(&headers, "header", nil, "with --http: a header K:V (repeatable)")
	c.Flags().StringVar(&body, "body", "", "with --http: the request's body")
	c.Flags().StringVar(&in, "in", "", "the compensator is the command after -- run in this helper sandbox (running); exit status 0 means compensated")
	return c
}

func consumeCmd(g *globals) *cobra.Command {
	var req v1.EffectConsumeRequest
	c := &cobra.Command{
		Use:   "consume EFFECT --by WHO",
		Short: "Mark an effect consumed: someone acted on it, so a rollback past it is refused unless forced or compensated",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			e, err := g.client().ConsumeEffect(ctx, args[0], req)
			if err != nil {
				return err
			}
			return g.print(e, func() { fmt.Printf("%s consumed by %d\n", e.ID, len(e.Consumers)) })
		},
	}
	c.Flags().StringVar(&req.By, "by", "", "who acted on it: a sandbox, an agent, a system")
	c.Flags().StringVar(&req.Note, "note", "", "what they did")
	return c
}

// printRollbackRest prints a rollback's note, its effect plan and its
// compensations.
func printRollbackRest(rb *v1.RollbackResult) {
	if rb.Note != "" {
		fmt.Println(rb.Note)
	}
	printPlan(rb.Plan)
	printCompensation(rb.Compensation)
}
