package httpapi

import (
	"net/netip"
	"sort"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/meta"
)

// Conversions from the engine's domain types (internal/meta) to the wire
// types of api/v1: the one place the two meet, so that either can change
// without the other (and the database format, which is meta's, does not
// follow the wire). Types whose fields are the same on both sides convert
// with Go's struct conversion, which stops compiling as soon as one side
// has a field the other lacks; the others map field by field, and
// TestConvertCoversEveryField fails when a wire field is left unmapped.
//
// The requests stay wire types: the engine takes them as decoded and
// validated (v1's Validate), and a domain copy of each would add a
// conversion without a difference. The constants (states, kinds, tiers,
// decisions) are api/v1's on both sides.

// mapSlice converts each element; nil stays nil (JSON null, not []).
func mapSlice[A, B any](l []A, f func(A) B) []B {
	if l == nil {
		return nil
	}
	out := make([]B, len(l))
	for i, a := range l {
		out[i] = f(a)
	}
	return out
}

func toImage(i meta.Image) v1.Image {
	return v1.Image{
		Name: i.Name, Source: i.Source, Created: i.Created, SizeBytes: i.SizeBytes,
		Config: toImageConfig(i.Config), Parent: i.Parent, Digest: i.Digest,
	}
}

func toImageConfig(c *meta.ImageConfig) *v1.ImageConfig {
	if c == nil {
		return nil
	}
	return &v1.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
}

func toImages(l []meta.Image) []v1.Image { return mapSlice(l, toImage) }

func toSandbox(s meta.Sandbox) v1.Sandbox {
	return v1.Sandbox{
		ID: s.ID, Name: s.Name, Tenant: s.Tenant, Image: s.Image, Hostname: s.Hostname,
		State: s.State, Reason: s.Reason, Offloaded: s.Offloaded, Created: s.Created, Pid: s.Pid,
		EnvNames:  envNames(s.Env),
		Secrets:   s.Secrets,
		Resources: v1.Resources(s.Resources),
		Seccomp:   s.Seccomp, Head: s.Head, ForkedFrom: s.ForkedFrom,
		Standby: s.Standby, Standbys: s.Standbys, StandbyBytes: s.StandbyBytes,
		Sessions:    mapSlice(s.Sessions, func(x meta.Session) v1.Session { return v1.Session(x) }),
		MemoryBytes: s.MemoryBytes, Processes: s.Processes, DiskUsedBytes: s.DiskUsedBytes,
		LimitsTampered: s.LimitsTampered,
		LastTampered:   (*v1.LimitsTampered)(s.LastTampered),
		Network:        s.Network,
		Address:        egressAddr(s.Egress),
		Egress:         toEgressPolicy(s.Egress),
		EffectPolicy:   s.EffectPolicy,
		Compensation:   toCompensationReport(s.Compensation),
	}
}

// envNames are the names of env, sorted: the values never leave the
// daemon (they may be credentials).
func envNames(env map[string]string) []string {
	if len(env) == 0 {
		return nil
	}
	out := make([]string, 0, len(env))
	for k := range env {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func toCompensationReport(c *meta.CompensationReport) *v1.CompensationReport {
	if c == nil {
		return nil
	}
	return &v1.CompensationReport{
		Checkpoint: c.Checkpoint, State: c.State, Compensated: c.Compensated, At: c.At,
		Failed: mapSlice(c.Failed, func(f meta.FailedCompensation) v1.FailedCompensation { return v1.FailedCompensation(f) }),
	}
}

func egressAddr(e *meta.Egress) string {
	if e == nil || !e.Addr.IsValid() {
		return ""
	}
	return e.Addr.String()
}

func toEgressPolicy(e *meta.Egress) *v1.EgressPolicy {
	if e == nil {
		return nil
	}
	p := e.Policy
	str := func(l []netip.Prefix) []string { return mapSlice(l, netip.Prefix.String) }
	return &v1.EgressPolicy{
		AllowDomains: p.AllowDomains, DenyDomains: p.DenyDomains, AllowCIDRs: str(p.AllowCIDRs), DenyCIDRs: str(p.DenyCIDRs),
		HTTPPorts: p.HTTPPorts, Inspect: p.Inspect, OnDivergence: string(p.Divergence),
		IgnoreHeaders: p.IgnoreHeaders, IgnoreJSONFields: p.IgnoreJSONFields,
	}
}

func toEffect(r ledger.Record, orphan bool) v1.Effect {
	e := v1.Effect{
		ID: r.ID, Seq: r.Seq, Prev: r.Prev, Sandbox: r.Sandbox, Origin: r.Origin, Turn: r.Turn, Checkpoint: r.Checkpoint,
		Kind: string(r.Kind), State: string(r.State), Proto: r.Request.Proto, Method: r.Request.Method, URL: r.Request.URL,
		Host: r.Request.Host, Addr: r.Request.Addr, BodyHash: r.Request.BodyHash, IdempotencyKey: r.Request.IdempotencyKey,
		Error: r.Error, ReplayOf: r.ReplayOf, Orphan: orphan, Declared: r.Declared, Type: r.Type, Started: r.Started, Finished: r.Finished,
	}
	if r.DependsOn != nil {
		e.DependsOn = *r.DependsOn
	}
	if c := r.Compensation; c != nil {
		e.Compensation = &v1.Compensation{State: string(c.State), Rollback: c.Rollback, Attempts: c.Attempts, Error: c.Error, At: c.At}
	}
	if resp := r.Response; resp != nil {
		e.Status, e.ResponseHeader, e.ResponseBody, e.ResponseBytes = resp.Status, resp.Header, resp.Body, resp.BodySize
		e.BytesOut, e.BytesIn, e.Answers = resp.BytesOut, resp.BytesIn, resp.Answers
	}
	if c := r.Compensator; c != nil {
		e.Compensator = &v1.Compensator{Method: c.Method, URL: c.URL, Header: c.Header, Body: c.Body, Sandbox: c.Sandbox, Command: c.Command}
	}
	e.Consumers = mapSlice(r.Consumers, func(c ledger.Consumer) v1.Consumer { return v1.Consumer(c) })
	return e
}

func toSandboxes(l []meta.Sandbox) []v1.Sandbox { return mapSlice(l, toSandbox) }

func toCheckpoint(c meta.Checkpoint) v1.Checkpoint {
	return v1.Checkpoint{
		ID: c.ID, Sandbox: c.Sandbox, Parent: c.Parent, Kind: c.Kind, Label: c.Label,
		Created: c.Created, StallMS: c.StallMS, DurationMS: c.DurationMS,
		Capture: c.Capture, CaptureNote: c.CaptureNote,
		StallParts:   (*v1.StallParts)(c.StallParts),
		BytesWritten: c.BytesWritten, ImageBytes: c.ImageBytes, Keep: c.Keep,
		Pending: c.Pending, Failed: c.Failed, FailedReason: c.FailedReason, DataKey: c.DataKey,
		ImportedFrom: c.ImportedFrom, ImportSigner: c.ImportSigner, InStore: c.InStore, Offloaded: c.Offloaded,
	}
}

func toCheckpoints(l []meta.Checkpoint) []v1.Checkpoint { return mapSlice(l, toCheckpoint) }

func toTurnEffects(e meta.TurnEffects) v1.TurnEffects {
	return v1.TurnEffects{
		Files:        mapSlice(e.Files, func(x meta.FileEffect) v1.FileEffect { return v1.FileEffect(x) }),
		Processes:    mapSlice(e.Processes, func(x meta.ProcessEffect) v1.ProcessEffect { return v1.ProcessEffect(x) }),
		Sockets:      mapSlice(e.Sockets, func(x meta.SocketEffect) v1.SocketEffect { return v1.SocketEffect(x) }),
		LongLived:    mapSlice(e.LongLived, func(x meta.LongLivedChange) v1.LongLivedChange { return v1.LongLivedChange(x) }),
		Sessions:     mapSlice(e.Sessions, func(x meta.SessionChange) v1.SessionChange { return v1.SessionChange(x) }),
		Unknown:      e.Unknown,
		IgnoredFiles: e.IgnoredFiles,
		Egress:       (*v1.EgressCounts)(e.Egress),
	}
}

func toTurnResult(r meta.TurnResult) v1.TurnResult {
	return v1.TurnResult{
		Sandbox: r.Sandbox, Turn: r.Turn, Decision: r.Decision, Checkpoint: r.Checkpoint,
		Head: r.Head, Reasons: r.Reasons, Effects: toTurnEffects(r.Effects),
		DecideMS: r.DecideMS, StallMS: r.StallMS, DurationMS: r.DurationMS, Pending: r.Pending,
	}
}

func toTurnRecord(r meta.TurnRecord) v1.TurnRecord {
	return v1.TurnRecord{
		TurnResult: toTurnResult(r.TurnResult),
		Prev:       r.Prev, Incomplete: r.Incomplete,
		Started: r.Started, Ended: r.Ended,
		Commands: mapSlice(r.Commands, func(x meta.TurnCommand) v1.TurnCommand { return v1.TurnCommand(x) }),
		LLM:      mapSlice(r.LLM, func(x meta.LLMCall) v1.LLMCall { return v1.LLMCall(x) }),
	}
}

func toTurnRecords(l []meta.TurnRecord) []v1.TurnRecord { return mapSlice(l, toTurnRecord) }

func toHost(h meta.Host) v1.Host {
	return v1.Host{
		Version: h.Version, Kernel: h.Kernel, Root: h.Root,
		Pool:      v1.Pool(h.Pool),
		Cgroup:    h.Cgroup,
		Features:  mapSlice(h.Features, func(x meta.Feature) v1.Feature { return v1.Feature(x) }),
		Sandboxes: h.Sandboxes, Started: h.Started,
		KeyID: h.KeyID, PublicKey: h.PublicKey, TrustedKeys: h.TrustedKeys,
	}
}

func toSessionRunResult(r meta.SessionRunResult) v1.SessionRunResult { return v1.SessionRunResult(r) }

func toRollbackResult(r meta.RollbackResult) v1.RollbackResult {
	out := v1.RollbackResult{Sandbox: r.Sandbox, Checkpoint: r.Checkpoint, Tier: r.Tier, DurationMS: r.DurationMS,
		ProcessesRestarted: r.ProcessesRestarted, Note: r.Note, Compensation: toCompensationReport(r.Compensation)}
	if p := r.Plan; p != nil {
		out.Plan = &v1.RollbackPlan{DryRun: p.DryRun, Orphan: p.Orphan, Replay: p.Replay, Compensate: p.Compensate,
			Block:     mapSlice(p.Block, func(b meta.BlockedEffect) v1.BlockedEffect { return v1.BlockedEffect(b) }),
			Decisions: mapSlice(p.Decisions, func(d meta.EffectDecision) v1.EffectDecision { return v1.EffectDecision(d) })}
	}
	return out
}

func toMigrateResult(r meta.Migration) v1.MigrateResult {
	return v1.MigrateResult{Sandbox: r.Sandbox, Target: r.Target, Checkpoint: r.Checkpoint, Checkpoints: r.Checkpoints,
		DowntimeMS: r.DowntimeMS, UploadMS: r.UploadMS, ResumeMS: r.ResumeMS,
		PrecopyMS: r.PrecopyMS, PrecopySentBytes: r.PrecopySentBytes}
}

func toRecoverResult(r meta.RecoverResult) v1.RecoverResult {
	out := v1.RecoverResult{Sandbox: r.Sandbox, Checkpoint: r.Checkpoint, Turn: r.Turn, Turns: r.Turns,
		LLMCalls: r.LLMCalls, Commands: r.Commands, Bytes: r.Bytes, DryRun: r.DryRun, Note: r.Note}
	if r.Rollback != nil {
		rb := toRollbackResult(*r.Rollback)
		out.Rollback = &rb
	}
	return out
}

func toRecoveryStatus(r meta.RecoveryStatus) v1.RecoveryStatus {
	return v1.RecoveryStatus{Sandbox: r.Sandbox, State: r.State, Checkpoint: r.Checkpoint, Turn: r.Turn,
		Replayed: r.Replayed, Total: r.Total, Bytes: r.Bytes, Divergence: (*v1.Divergence)(r.Divergence)}
}

func toChainVerification(r meta.ChainVerification) v1.ChainVerification {
	return v1.ChainVerification{Checkpoint: r.Checkpoint, OK: r.OK, Key: r.Key, Trusted: r.Trusted,
		Links: mapSlice(r.Links, func(l meta.ChainLink) v1.ChainLink { return v1.ChainLink(l) })}
}

func toForkResult(r meta.ForkResult) v1.ForkResult {
	return v1.ForkResult{
		Checkpoint: r.Checkpoint, Sandboxes: toSandboxes(r.Sandboxes),
		DurationMS: r.DurationMS, ForksPerSecond: r.ForksPerSecond, Reseeded: r.Reseeded,
	}
}
