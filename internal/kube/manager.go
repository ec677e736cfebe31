package kube

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kv1 "github.com/molt-sh/molt/api/kube/v1alpha1"
)

// Scheme holds Kubernetes' own types and molt's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := kv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// ManagerOptions are what the two managers share.
type ManagerOptions struct {
	// MetricsAddr is the metrics listener ("0": none).
	MetricsAddr string
	// ProbeAddr is the health probes' listener ("": none).
	ProbeAddr string
	// LeaderElection makes one controller of many act (the controller
	// only: each node has one agent).
	LeaderElection          bool
	LeaderElectionNamespace string
}

func (o ManagerOptions) manager(cfg *rest.Config, id string, c cache.Options) (ctrl.Manager, error) {
	addr := o.MetricsAddr
	if addr == "" {
		addr = "0"
	}
	return ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  Scheme(),
		Metrics:                 metricsserver.Options{BindAddress: addr},
		HealthProbeBindAddress:  o.ProbeAddr,
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        id,
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		Cache:                   c,
	})
}

// NewControllerManager is the controller's manager with the Scheduler.
func NewControllerManager(cfg *rest.Config, s *Scheduler, o ManagerOptions) (ctrl.Manager, error) {
	mgr, err := o.manager(cfg, "molt-controller.molt.sh", cache.Options{})
	if err != nil {
		return nil, err
	}
	s.Client = mgr.GetClient()
	if s.Events == nil {
		s.Events = mgr.GetEventRecorder(controllerEvents)
	}
	if err := s.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	return mgr, nil
}

// NewAgentManager is a node agent's manager: its cache holds only the
// Sandboxes bound to a.Node.
func NewAgentManager(cfg *rest.Config, a *Agent, o ManagerOptions) (ctrl.Manager, error) {
	o.LeaderElection = false
	mgr, err := o.manager(cfg, "", cache.Options{ByObject: CacheOptions(a.Node)})
	if err != nil {
		return nil, err
	}
	a.Client = mgr.GetClient()
	if a.Events == nil {
		a.Events = mgr.GetEventRecorder(agentEvents)
	}
	if err := a.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	return mgr, nil
}
