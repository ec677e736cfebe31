package kube

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// Events: the controller and the node agents report what they did to a
// resource as Kubernetes Events (events.k8s.io/v1), beside its status:
// a Sandbox bound, running, suspended, expired or failed; a checkpoint
// taken or failed; a rollback done or failed. `kubectl events` and
// `kubectl describe` show them.

// Reporting controllers' names (events' reportingController).
const (
	controllerEvents = "molt.sh/controller"
	agentEvents      = "molt.sh/node-agent"
)

// emit records an event on obj with r (nothing if r is nil).
func emit(r events.EventRecorder, obj runtime.Object, warning bool, reason, action, note string) {
	if r == nil {
		return
	}
	t := corev1.EventTypeNormal
	if warning {
		t = corev1.EventTypeWarning
	}
	r.Eventf(obj, nil, t, reason, action, "%s", note)
}
