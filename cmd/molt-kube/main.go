// Command molt-kube runs molt sandboxes as Kubernetes resources
// (api/kube/v1alpha1; docs/kubernetes.md): `molt-kube controller` is the
// cluster's controller (a Deployment), `molt-kube agent` the node agent
// (a DaemonSet, next to each node's molt daemon).
package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/kube"
)

func main() {
	ctrl.SetLogger(zap.New())
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "molt-kube:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "molt-kube",
		Short:         "Run molt sandboxes as Kubernetes resources",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var o kube.ManagerOptions
	var heartbeat time.Duration
	root.PersistentFlags().StringVar(&o.MetricsAddr, "metrics-addr", "0", "listen address of the metrics endpoint (\"0\": none)")
	root.PersistentFlags().StringVar(&o.ProbeAddr, "probe-addr", ":8081", "listen address of /healthz and /readyz (\"\": none)")
	root.PersistentFlags().DurationVar(&heartbeat, "heartbeat", kube.DefaultHeartbeat, "node agents' heartbeat interval (the controller's must match)")

	ctl := &cobra.Command{
		Use:     "controller",
		Short:   "Run the controller: places sandboxes on nodes, frees suspended ones",
		Example: "  molt-kube controller --leader-elect --leader-elect-namespace molt-system",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := ctrl.GetConfig()
			if err != nil {
				return err
			}
			mgr, err := kube.NewControllerManager(cfg, &kube.Scheduler{Heartbeat: heartbeat}, o)
			if err != nil {
				return err
			}
			return run(mgr, o)
		},
	}
	ctl.Flags().BoolVar(&o.LeaderElection, "leader-elect", false, "elect one active controller among replicas (a Lease)")
	ctl.Flags().StringVar(&o.LeaderElectionNamespace, "leader-elect-namespace", "", "namespace of the leader election's Lease (default: the pod's)")

	var a kube.Agent
	var socket string
	var capacity int
	agent := &cobra.Command{
		Use:     "agent",
		Short:   "Run a node agent: makes the sandboxes bound to this node true on its molt daemon",
		Example: "  molt-kube agent --node \"$NODE_NAME\" --socket /run/molt/molt.sock --capacity 64",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.Node == "" {
				return errors.New("--node (or NODE_NAME) is required")
			}
			if capacity < 0 || capacity > 1<<20 {
				return fmt.Errorf("--capacity %d: want 0..%d", capacity, 1<<20)
			}
			a.Capacity, a.Heartbeat, a.Daemon = int32(capacity), heartbeat, client.New(socket)
			cfg, err := ctrl.GetConfig()
			if err != nil {
				return err
			}
			mgr, err := kube.NewAgentManager(cfg, &a, o)
			if err != nil {
				return err
			}
			return run(mgr, o)
		},
	}
	agent.Flags().StringVar(&a.Node, "node", os.Getenv("NODE_NAME"), "this node's name (the MoltNode's)")
	agent.Flags().StringVar(&socket, "socket", client.DefaultSocket, "the molt daemon's socket")
	agent.Flags().IntVar(&capacity, "capacity", 32, "sandboxes the node runs at most, when the agent makes its MoltNode")
	root.AddCommand(ctl, agent)
	return root
}

func run(mgr ctrl.Manager, o kube.ManagerOptions) error {
	if o.ProbeAddr != "" {
		if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
			return err
		}
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
