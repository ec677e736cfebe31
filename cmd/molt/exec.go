// molt exec: a command in a sandbox, its streams attached.

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/spf13/cobra"
)

func execCmd(g *globals) *cobra.Command {
	var session, cwd, user string
	var env []string
	var detach, noStdin, aside bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "exec SANDBOX [--session S] [--detach] [-- CMD...]",
		Short: "Run a command in a sandbox (exit code = the command's)",
		Long: "Run a command in a sandbox. Output is streamed, stdin is passed (unless --no-stdin), and molt exits with the command's exit code.\n" +
			"With --session S the arguments are shell text run in the persistent bash session S (created on first use): cwd, variables and functions persist between calls.\n" +
			"A command killed at --timeout exits with 124.\n" +
			"Without CMD, the sandbox's image's default command runs (an OCI image's Entrypoint and Cmd); its WorkingDir and User are the defaults of --cwd and --user.",
		Example: "  molt exec sb1 -- ls /\n  molt exec sb1          # the image's Entrypoint + Cmd",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e, err := parseEnv(env)
			if err != nil {
				return err
			}
			cl := g.client()
			ref, argv := args[0], args[1:]
			if session != "" {
				if len(argv) == 0 {
					return fmt.Errorf("--session needs shell text to run")
				}
				if detach || len(env) > 0 || cwd != "" || user != "" {
					return fmt.Errorf("--session cannot be combined with --detach, --env, --cwd or --user (use shell text: cd, export)")
				}
				sctx, stop := signal.NotifyContext(ctx, os.Interrupt)
				defer stop()
				res, err := cl.SessionRun(sctx, ref, session, v1.SessionRunRequest{Command: strings.Join(argv, " "), TimeoutMS: timeout.Milliseconds(), Aside: aside})
				if err != nil {
					return err
				}
				if g.json {
					if err := g.print(res, nil); err != nil {
						return err
					}
				} else {
					io.WriteString(os.Stdout, res.Stdout)
					io.WriteString(os.Stderr, res.Stderr)
				}
				if res.ExitCode != 0 {
					return &exitError{code: res.ExitCode}
				}
				return nil
			}
			req := v1.ExecRequest{Args: argv, Env: e, Cwd: cwd, User: user, TimeoutMS: timeout.Milliseconds(), Aside: aside}
			if detach {
				pid, err := cl.ExecDetached(ctx, ref, req)
				if err != nil {
					return err
				}
				return g.print(v1.ExecDetached{Pid: pid}, func() { fmt.Println(pid) })
			}
			eio := client.ExecIO{Stdout: os.Stdout, Stderr: os.Stderr}
			var out, errb strings.Builder
			if g.json {
				eio.Stdout, eio.Stderr = &out, &errb
			}
			if !noStdin {
				eio.Stdin = os.Stdin
			}
			sigs := make(chan os.Signal, 4)
			nums := make(chan int, 4)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
			defer signal.Stop(sigs)
			go func() {
				for s := range sigs {
					nums <- int(s.(syscall.Signal))
				}
			}()
			eio.Signals = nums
			st, err := cl.Exec(ctx, ref, req, eio)
			if err != nil {
				return err
			}
			if g.json {
				if err := g.print(map[string]any{"exit_code": st.ExitCode, "signal": st.Signal, "timed_out": st.TimedOut, "stdout": out.String(), "stderr": errb.String()}, nil); err != nil {
					return err
				}
			}
			if st.ExitCode != 0 {
				return &exitError{code: st.ExitCode}
			}
			return nil
		},
	}
	c.Flags().StringVar(&session, "session", "", "run the text in this persistent bash session")
	c.Flags().BoolVarP(&detach, "detach", "d", false, "leave the command running in the background; prints its PID")
	c.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	c.Flags().StringVarP(&cwd, "cwd", "w", "", "working directory inside the sandbox (default: the image's WorkingDir, else /)")
	c.Flags().StringVarP(&user, "user", "u", "", "user name or uid[:gid] inside the sandbox (default: the image's User, else root)")
	c.Flags().DurationVar(&timeout, "timeout", 0, "kill the command after this long (exit code 124)")
	c.Flags().BoolVarP(&noStdin, "no-stdin", "n", false, "give the command /dev/null as stdin")
	c.Flags().BoolVar(&aside, "aside", false, "run beside the agent (an operator's look): not recorded in the turn log, not answered or matched by a recovery's fast-forward")
	return c
}
