// Package v1alpha1 is molt's Kubernetes API, group molt.sh, version
// v1alpha1: sandboxes as resources (Sandbox, shaped like the Sandbox of
// kubernetes-sigs/agent-sandbox), their checkpoints and rollbacks as
// companion resources (SandboxCheckpoint, SandboxRollback, as KubeVirt's
// VirtualMachineSnapshot and VirtualMachineRestore), and the nodes that
// run them (MoltNode). docs/kubernetes.md says why molt has a group of
// its own and how the controller and the node agents share the work.
//
// +kubebuilder:object:generate=true
// +groupName=molt.sh
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of these resources.
var GroupVersion = schema.GroupVersion{Group: "molt.sh", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the resources.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds them to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Sandbox{}, &SandboxList{},
		&SandboxCheckpoint{}, &SandboxCheckpointList{},
		&SandboxRollback{}, &SandboxRollbackList{},
		&MoltNode{}, &MoltNodeList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Labels and finalizers of the resources.
const (
	// NodeLabel binds a Sandbox to the MoltNode that runs it. The
	// controller sets it (scheduling) and removes it once a suspended
	// sandbox is in the object store; a node agent acts only on the
	// sandboxes bound to its node.
	NodeLabel = "molt.sh/node"
	// SandboxFinalizer keeps a Sandbox until its node agent has removed
	// the molt sandbox.
	SandboxFinalizer = "molt.sh/sandbox"
	// CheckpointFinalizer keeps a SandboxCheckpoint until the node agent
	// of its sandbox has deleted the molt checkpoint.
	CheckpointFinalizer = "molt.sh/checkpoint"
)

// OperatingMode is what a Sandbox should be doing.
// +kubebuilder:validation:Enum=Running;Suspended
type OperatingMode string

// The operating modes.
const (
	// Running: the sandbox runs on a node.
	Running OperatingMode = "Running"
	// Suspended: the sandbox is hibernated to the object store (its
	// processes checkpointed, its local copy freed) and bound to no
	// node; back to Running, it resumes on any node.
	Suspended OperatingMode = "Suspended"
)

// SandboxPhase is where a Sandbox is in its life.
type SandboxPhase string

// The phases of a Sandbox.
const (
	SandboxPending   SandboxPhase = "Pending"   // not yet on a node
	SandboxRunning   SandboxPhase = "Running"   // running on Status.NodeName
	SandboxSuspended SandboxPhase = "Suspended" // hibernated; Offloaded once in the store
	SandboxFailed    SandboxPhase = "Failed"    // see Status.Message; retried
	SandboxExpired   SandboxPhase = "Expired"   // past Lifecycle.ShutdownTime, removed
)

// ShutdownPolicy says what happens to the Sandbox resource when its
// sandbox expires.
// +kubebuilder:validation:Enum=Delete;Retain
type ShutdownPolicy string

// The shutdown policies.
const (
	ShutdownDelete ShutdownPolicy = "Delete"
	ShutdownRetain ShutdownPolicy = "Retain"
)

// Lifecycle bounds a sandbox's life, as agent-sandbox's does.
type Lifecycle struct {
	// ShutdownTime is when the sandbox expires: its molt sandbox (and
	// its checkpoints) are removed.
	// +optional
	ShutdownTime *metav1.Time `json:"shutdownTime,omitempty"`
	// ShutdownPolicy: Delete removes the resource too; Retain keeps it,
	// in phase Expired.
	// +kubebuilder:default=Retain
	// +optional
	ShutdownPolicy ShutdownPolicy `json:"shutdownPolicy,omitempty"`
}

// SandboxSource makes a sandbox as a fork of a checkpoint.
type SandboxSource struct {
	// CheckpointName names a ready SandboxCheckpoint of the namespace.
	// +kubebuilder:validation:MinLength=1
	CheckpointName string `json:"checkpointName"`
}

// SandboxResources are a sandbox's limits (molt create --memory --cpus
// --pids); zero values take the daemon's defaults.
type SandboxResources struct {
	// MemoryMiB limits the sandbox's memory.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	// MilliCPU limits its CPU time (1000: one core).
	// +kubebuilder:validation:Minimum=0
	// +optional
	MilliCPU int64 `json:"milliCPU,omitempty"`
	// Pids limits its number of processes.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Pids int64 `json:"pids,omitempty"`
}

// SandboxSpec is the desired state of a Sandbox.
// +kubebuilder:validation:XValidation:rule="has(self.image) != has(self.source)",message="exactly one of image and source"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.image) || (has(self.image) && self.image == oldSelf.image)",message="image is immutable"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.source) || (has(self.source) && self.source == oldSelf.source)",message="source is immutable"
type SandboxSpec struct {
	// Image is the molt image (molt image ls) of a new sandbox.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Image string `json:"image,omitempty"`
	// Source makes the sandbox a fork of a checkpoint instead.
	// +optional
	Source *SandboxSource `json:"source,omitempty"`
	// OperatingMode is Running (the default) or Suspended.
	// +kubebuilder:default=Running
	// +optional
	OperatingMode OperatingMode `json:"operatingMode,omitempty"`
	// Resources are its limits, fixed at creation.
	// +optional
	Resources SandboxResources `json:"resources,omitempty"`
	// Lifecycle bounds its life.
	// +optional
	Lifecycle Lifecycle `json:"lifecycle,omitempty"`
}

// SandboxStatus is the observed state of a Sandbox.
type SandboxStatus struct {
	// Phase is where the sandbox is.
	// +optional
	Phase SandboxPhase `json:"phase,omitempty"`
	// NodeName is the node running it, or that last ran it.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// SandboxID is the molt sandbox's ID; it moves between nodes with
	// the sandbox.
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// Head is the molt checkpoint the sandbox would resume from.
	// +optional
	Head string `json:"head,omitempty"`
	// Offloaded says the suspended sandbox is in the object store only:
	// any node can resume it.
	// +optional
	Offloaded bool `json:"offloaded,omitempty"`
	// Message says why the sandbox is Pending or Failed.
	// +optional
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the generation the node agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Scheduled (the controller) and Ready (the node agent).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Sandbox is a molt sandbox: an isolated Linux environment with its
// files and processes, checkpointed, rolled back, forked, hibernated to
// the object store and resumed on any node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=msb
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.operatingMode`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="ID",type=string,JSONPath=`.status.sandboxID`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxSpec   `json:"spec"`
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

// CheckpointKind is what a SandboxCheckpoint captures.
// +kubebuilder:validation:Enum=Full;Files
type CheckpointKind string

// The checkpoint kinds.
const (
	// Full: files and processes.
	CheckpointFull CheckpointKind = "Full"
	// Files: the file system only.
	CheckpointFiles CheckpointKind = "Files"
)

// OperationPhase is where a checkpoint or a rollback is.
type OperationPhase string

// The phases of SandboxCheckpoints and SandboxRollbacks.
const (
	OperationPending   OperationPhase = "Pending"
	OperationSucceeded OperationPhase = "Succeeded"
	OperationFailed    OperationPhase = "Failed"
)

// SandboxCheckpointSpec asks for a checkpoint of a sandbox.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
type SandboxCheckpointSpec struct {
	// SandboxName names a Sandbox of the namespace.
	// +kubebuilder:validation:MinLength=1
	SandboxName string `json:"sandboxName"`
	// Kind is Full (the default) or Files.
	// +kubebuilder:default=Full
	// +optional
	Kind CheckpointKind `json:"kind,omitempty"`
}

// SandboxCheckpointStatus is the checkpoint as taken.
type SandboxCheckpointStatus struct {
	// Phase: Pending, Succeeded (the checkpoint is committed) or Failed.
	// +optional
	Phase OperationPhase `json:"phase,omitempty"`
	// CheckpointID is molt's ID of the checkpoint.
	// +optional
	CheckpointID string `json:"checkpointID,omitempty"`
	// SandboxID is the molt sandbox it was taken of.
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// NodeName is the node that took it.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// TakenAt is when it was committed.
	// +optional
	TakenAt *metav1.Time `json:"takenAt,omitempty"`
	// Message says why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// SandboxCheckpoint is a checkpoint of a Sandbox, taken once by the
// node agent that runs it. A Sandbox with a source forks from one; a
// SandboxRollback rolls back to one, on whichever node the sandbox runs
// by then (the object store carries it).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mckpt
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="ID",type=string,JSONPath=`.status.checkpointID`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
type SandboxCheckpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxCheckpointSpec   `json:"spec"`
	Status SandboxCheckpointStatus `json:"status,omitempty"`
}

// SandboxCheckpointList is a list of SandboxCheckpoints.
// +kubebuilder:object:root=true
type SandboxCheckpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxCheckpoint `json:"items"`
}

// SandboxRollbackSpec asks to roll a sandbox back to a checkpoint of it.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
type SandboxRollbackSpec struct {
	// SandboxName names a running Sandbox of the namespace.
	// +kubebuilder:validation:MinLength=1
	SandboxName string `json:"sandboxName"`
	// CheckpointName names a succeeded SandboxCheckpoint of it.
	// +kubebuilder:validation:MinLength=1
	CheckpointName string `json:"checkpointName"`
}

// SandboxRollbackStatus is the rollback as done.
type SandboxRollbackStatus struct {
	// Phase: Pending, Succeeded or Failed (not retried: molt refused it,
	// Message says why).
	// +optional
	Phase OperationPhase `json:"phase,omitempty"`
	// NodeName is the node that rolled the sandbox back.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// Tier is how the rollback was served (hot, warm, cold).
	// +optional
	Tier string `json:"tier,omitempty"`
	// CompletedAt is when it was done.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
	// Message says why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// SandboxRollback rolls a Sandbox back to a SandboxCheckpoint, once.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mrb
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxName`
// +kubebuilder:printcolumn:name="Checkpoint",type=string,JSONPath=`.spec.checkpointName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
type SandboxRollback struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SandboxRollbackSpec   `json:"spec"`
	Status SandboxRollbackStatus `json:"status,omitempty"`
}

// SandboxRollbackList is a list of SandboxRollbacks.
// +kubebuilder:object:root=true
type SandboxRollbackList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxRollback `json:"items"`
}

// MoltNodeSpec is what a node offers.
type MoltNodeSpec struct {
	// Capacity is how many sandboxes the node runs at most.
	// +kubebuilder:validation:Minimum=0
	Capacity int32 `json:"capacity"`
	// Unschedulable keeps new and resumed sandboxes off the node
	// (running ones stay).
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`
}

// MoltNodeStatus is what the node's agent reports, every heartbeat.
type MoltNodeStatus struct {
	// HeartbeatTime is the agent's last report; a node not heard from
	// for three heartbeats gets no new sandboxes.
	// +optional
	HeartbeatTime *metav1.Time `json:"heartbeatTime,omitempty"`
	// Sandboxes counts the molt sandboxes the node runs.
	// +optional
	Sandboxes int32 `json:"sandboxes,omitempty"`
	// Checkpoints are the molt checkpoints, among those of the cluster's
	// SandboxCheckpoints, whose data the node holds locally (a fork or a
	// resume there needs no fetch); at most 1024.
	// +optional
	Checkpoints []string `json:"checkpoints,omitempty"`
	// HostKey is the public key (PEM) the node's daemon signs its
	// checkpoints and store documents with: the other nodes' agents have
	// their daemons trust it, so what is suspended here resumes there.
	// +optional
	HostKey string `json:"hostKey,omitempty"`
	// Message says what the agent last failed at.
	// +optional
	Message string `json:"message,omitempty"`
}

// MoltNode is a node that runs molt sandboxes: a molt daemon and its
// node agent, named after the Kubernetes node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=mnode
// +kubebuilder:printcolumn:name="Capacity",type=integer,JSONPath=`.spec.capacity`
// +kubebuilder:printcolumn:name="Sandboxes",type=integer,JSONPath=`.status.sandboxes`
// +kubebuilder:printcolumn:name="Heartbeat",type=date,JSONPath=`.status.heartbeatTime`
type MoltNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MoltNodeSpec   `json:"spec"`
	Status MoltNodeStatus `json:"status,omitempty"`
}

// MoltNodeList is a list of MoltNodes.
// +kubebuilder:object:root=true
type MoltNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MoltNode `json:"items"`
}
