// The root command, the global flags and the helpers the subcommands
// share: JSON or human output, sizes, environment pairs.

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/molt-sh/molt/client"
	"github.com/spf13/cobra"
)

type globals struct {
	root   string
	socket string
	json   bool
	// A remote daemon's TCP listener and a tenant's token.
	endpoint, token, tlsCA string
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
	root.PersistentFlags().StringVar(&g.endpoint, "endpoint", os.Getenv("MOLT_ENDPOINT"), "a daemon's TCP listener, https://HOST:PORT, instead of the socket (env MOLT_ENDPOINT; needs --token)")
	root.PersistentFlags().StringVar(&g.token, "token", os.Getenv("MOLT_TOKEN"), "a tenant's API token for --endpoint (env MOLT_TOKEN)")
	root.PersistentFlags().StringVar(&g.tlsCA, "tls-ca", os.Getenv("MOLT_TLS_CA"), "PEM file of the CA that signed --endpoint's certificate (env MOLT_TLS_CA; default the system's roots)")
	root.AddCommand(
		daemonCmd(g), hostCmd(g), imageCmd(g), createCmd(g), lsCmd(g), inspectCmd(g), rmCmd(g),
		stopCmd(g), startCmd(g), execCmd(g), commitCmd(g), checkpointCmd(g), checkpointsCmd(g), rollbackCmd(g), recoverCmd(g),
		forkCmd(g), hibernateCmd(g), resumeCmd(g), migrateCmd(g), storeCmd(g), turnCmd(g), turnsCmd(g), effectsCmd(g), consumeCmd(g), compensatorCmd(g), llmCmd(g), auditCmd(g), tenantCmd(g), tokenCmd(g), keyCmd(g), benchCmd(g), demoCmd(g),
	)
	// cobra's completion command, made now so that it takes examples
	// too; sandbox, checkpoint, image and effect names complete from
	// the daemon.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Example = completionExamples
		}
	}
	applyExamples(root)
	completeArgs(g, root)
	return root
}

func (g *globals) client() *client.Client {
	if g.endpoint == "" {
		return client.New(g.socket)
	}
	var cfg *tls.Config
	if g.tlsCA != "" {
		b, err := os.ReadFile(g.tlsCA)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(b) {
			fmt.Fprintf(os.Stderr, "molt: --tls-ca %s: no PEM certificate read\n", g.tlsCA)
			os.Exit(2)
		}
		cfg = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return client.NewRemote(g.endpoint, g.token, cfg)
}

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

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
