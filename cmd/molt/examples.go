package main

import (
	"context"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// examples are the help's examples of the commands that do not carry
// their own (cobra.Command.Example), by command path. Every runnable
// command has one (TestEveryCommandHasExample).
var examples = map[string]string{
	"molt daemon": `  molt daemon
  molt daemon --root /var/lib/molt --pool-size 50G --standby-budget 4G
  molt daemon --kek-file /etc/molt/kek --listen tcp://0.0.0.0:7443 --tls-cert cert.pem --tls-key key.pem`,
	"molt host":         "  molt host\n  molt host --json",
	"molt demo":         "  molt demo\n  molt demo --dir /var/tmp",
	"molt image build":  "  molt image build debian\n  molt image build py --packages python3,python3-pip",
	"molt image import": "  molt image import tools ./rootfs.tar.gz\n  molt image import tools ./rootfs/",
	"molt image ls":     "  molt image ls\n  molt image ls --json",
	"molt image rm":     "  molt image rm tools",
	"molt create": `  molt create debian
  molt create debian --name agent-1 --memory 2G --cpus 1.5 --disk 10G
  molt create debian --network egress --allow api.example.com --secret API_KEY=@./api-key`,
	"molt ls":          "  molt ls\n  molt ls --json",
	"molt store gc":    "  molt store gc --dry-run\n  molt store gc --grace 6h",
	"molt store trust": "  molt store trust /mnt/other-host/keys/host.pub\n  ssh other-host cat /var/lib/molt/keys/host.pub | molt store trust -",
	"molt inspect":     "  molt inspect agent-1\n  molt inspect agent-1 --json",
	"molt rm":          "  molt rm agent-1\n  molt rm $(molt ls --json | jq -r '.[].id')",
	"molt stop":        "  molt stop agent-1",
	"molt start":       "  molt start agent-1",
	"molt exec": `  molt exec agent-1 -- ls -la /
  molt exec agent-1 --session main -- 'cd /srv && export MODE=test'
  molt exec agent-1 --detach -- python3 -m http.server 8000
  molt exec agent-1 --user 1000 --cwd /home/user --timeout 30s -- make test`,
	"molt checkpoint": `  molt checkpoint agent-1
  molt checkpoint agent-1 --kind full --label before-install --wait
  molt checkpoint agent-1 --kind auto`,
	"molt checkpoint inspect": "  molt checkpoint inspect before-install\n  molt checkpoint inspect 3b0ad5e0aeea --json",
	"molt checkpoint rm":      "  molt checkpoint rm before-install 3b0ad5e0aeea",
	"molt checkpoint verify":  "  molt checkpoint verify before-install\n  molt checkpoint verify before-install --chain",
	"molt checkpoints":        "  molt checkpoints agent-1\n  molt checkpoints agent-1 --json",
	"molt rollback": `  molt rollback agent-1 before-install
  molt rollback agent-1 before-install --dry-run
  molt rollback agent-1 3b0ad5e0aeea --tier cold`,
	"molt recover": `  molt recover agent-1 --dry-run
  molt recover agent-1
  molt recover agent-1 --status`,
	"molt fork":      "  molt fork agent-1\n  molt fork before-install --n 8 --reseed",
	"molt hibernate": "  molt hibernate agent-1\n  molt hibernate agent-1 --offload     # then free the local copy: resume here or on any daemon sharing the store",
	"molt resume":    "  molt resume agent-1",
	"molt migrate":   "  molt migrate agent-1 --to https://host-b:7443 --to-token-file b.token --to-ca b-ca.pem",
	"molt turn":      "  molt turn agent-1\n  molt turn agent-1 --dry-run\n  molt turn agent-1 --label step-3 --ignore '/tmp/**'",
	"molt turns":     "  molt turns agent-1\n  molt turns agent-1 --json",
	"molt effects":   "  molt effects agent-1\n  molt effects agent-1 --since before-install --json",
	"molt consume":   "  molt consume 7f3a2c --by billing-service --note 'invoice 42 sent'",
	"molt compensator": `  molt compensator 7f3a2c --http POST https://api.example.com/refunds --header 'Content-Type: application/json' --body '{"charge":"ch_1"}'
  molt compensator 7f3a2c --in agent-1 -- ./undo-deploy.sh`,
	"molt llm":          "  molt llm agent-1 --upstream https://api.openai.com/v1 --header @./auth-headers\n  molt llm agent-1 --upstream http://127.0.0.1:11434 --gate exec",
	"molt llm rm":       "  molt llm rm agent-1",
	"molt audit export": "  molt audit export --out audit.jsonl\n  molt audit export --since 1200",
	"molt audit verify": `  molt audit verify
  molt audit verify audit.jsonl --anchor-file /var/lib/molt/audit/audit.anchor`,
	"molt tenant create": "  molt tenant create acme",
	"molt tenant ls":     "  molt tenant ls",
	"molt tenant rm":     "  molt tenant rm acme",
	"molt token create": `  molt token create --tenant acme
  molt token create --tenant acme --scope read,exec --sandbox agent-1 --note 'CI runner'`,
	"molt token ls": "  molt token ls\n  molt token ls --tenant acme",
	"molt token rm": "  molt token rm 5d1e0c",
	"molt key ls":   "  molt key ls",
	"molt bench fs": "  molt bench fs\n  molt bench fs --sizes 10M --iterations 10",
	"molt bench cr": "  molt bench cr\n  molt bench cr --heap 100 --iterations 10",
	"molt bench rollback": `  molt bench rollback
  molt bench rollback --iterations 15 --restarts 1`,
	"molt bench search":   "  molt bench search --budget 10s --rounds 3",
	"molt bench fork":     "  molt bench fork --n 8 --rounds 3",
	"molt bench egress":   "  molt bench egress --requests 200 --rounds 3",
	"molt bench fleet":    "  molt bench fleet\n  molt bench fleet --sandboxes 4,8 --max-turns 10\n  molt bench fleet --store s3://bucket/bench --store-endpoint https://s3.example.net",
	"molt bench recovery": "  molt bench recovery --trajectories 20 --crashes 3",
	"molt bench turns":    "  molt bench turns\n  molt bench turns --runs 3 --modes off,auto",
}

// completeArgs gives commands whose arguments name sandboxes,
// checkpoints, images, effects or tenants a completion of those names
// from the daemon, by the placeholders of their Use line (SANDBOX,
// CHECKPOINT, ...), unless they complete on their own.
func completeArgs(g *globals, c *cobra.Command) {
	for _, s := range c.Commands() {
		completeArgs(g, s)
	}
	if c.ValidArgsFunction != nil || !c.Runnable() {
		return
	}
	places := usePlaceholders(c.Use)
	if len(places) == 0 {
		return
	}
	c.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		i := len(args)
		if i >= len(places) {
			if p := places[len(places)-1]; strings.HasSuffix(p, "...") {
				i = len(places) - 1
			} else {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
		}
		return g.completeNames(strings.TrimSuffix(places[i], "..."), args), cobra.ShellCompDirectiveNoFileComp
	}
}

var placeholder = regexp.MustCompile(`^[A-Z][A-Z|]*(\.\.\.)?$`)

// usePlaceholders returns the positional placeholders of a Use line:
// "rollback SANDBOX CHECKPOINT" gives SANDBOX, CHECKPOINT. Flags and
// what follows "--" are not arguments completed here.
func usePlaceholders(use string) []string {
	var out []string
	for _, w := range strings.Fields(use)[1:] {
		if w == "--" || strings.HasPrefix(w, "-") || strings.HasPrefix(w, "[") || strings.HasPrefix(w, "(") {
			break
		}
		if !placeholder.MatchString(w) {
			return nil
		}
		out = append(out, w)
	}
	return out
}

// completeNames lists what a placeholder names, as the daemon knows it
// now; nothing when the daemon cannot be reached (a completion never
// fails loudly).
func (g *globals) completeNames(kind string, args []string) []cobra.Completion {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cl := g.client()
	var out []cobra.Completion
	sandboxes := func() {
		sbs, err := cl.Sandboxes(ctx)
		if err != nil {
			return
		}
		for _, s := range sbs {
			out = append(out, cobra.CompletionWithDesc(s.ID, s.Name+" "+s.State))
		}
	}
	checkpoints := func(ref string) {
		cks, err := cl.Checkpoints(ctx, ref)
		if err != nil {
			return
		}
		for _, c := range cks {
			out = append(out, cobra.CompletionWithDesc(c.ID, strings.TrimSpace(c.Kind+" "+c.Label)))
			if c.Label != "" {
				out = append(out, cobra.CompletionWithDesc(c.Label, c.Kind+" "+c.ID))
			}
		}
	}
	switch kind {
	case "SANDBOX":
		sandboxes()
	case "CHECKPOINT":
		if len(args) > 0 {
			checkpoints(args[0])
			break
		}
		if sbs, err := cl.Sandboxes(ctx); err == nil {
			for _, s := range sbs {
				checkpoints(s.ID)
			}
		}
	case "SANDBOX|CHECKPOINT":
		sandboxes()
		if sbs, err := cl.Sandboxes(ctx); err == nil {
			for _, s := range sbs {
				checkpoints(s.ID)
			}
		}
	case "IMAGE":
		if imgs, err := cl.Images(ctx); err == nil {
			for _, im := range imgs {
				out = append(out, cobra.CompletionWithDesc(im.Name, im.Source))
			}
		}
	case "EFFECT":
		if sbs, err := cl.Sandboxes(ctx); err == nil {
			for _, s := range sbs {
				effs, err := cl.Effects(ctx, s.ID, "")
				if err != nil {
					continue
				}
				for _, e := range effs {
					out = append(out, cobra.CompletionWithDesc(e.ID, s.ID))
				}
			}
		}
	}
	return out
}

// applyExamples sets each command's example from examples where it has
// none of its own, and the completion command's.
func applyExamples(c *cobra.Command) {
	for _, s := range c.Commands() {
		applyExamples(s)
	}
	if c.Example == "" {
		c.Example = examples[c.CommandPath()]
	}
}

// completionExamples is the help of `molt completion`.
const completionExamples = `  source <(molt completion bash)
  molt completion bash > /etc/bash_completion.d/molt
  molt completion zsh > "${fpath[1]}/_molt"
  molt completion fish > ~/.config/fish/completions/molt.fish`
