package core

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/egress"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
)

// Egress and the effect ledger, as the engine uses them: a sandbox with
// NetworkEgress has an address and a policy in its record; its network
// namespace (a new one with every restore) gets a veth prepared before
// CRIU restores into it and is routed to once the tree is the
// sandbox's; checkpoints remember the ledger head, rollbacks rewind it,
// forks branch it.

// EgressConfig configures the host's egress (daemon flags).
type EgressConfig struct {
	Range  netip.Prefix // 0: egress.DefaultRange
	Uplink string       // network namespace egress leaves through ("" the host's)
	DNS    []string     // upstream resolvers ("" the host's)
	// CAFile holds extra roots the proxy trusts for the world's TLS (a
	// test internet's CA, a corporate proxy's).
	CAFile string
	// Compensations (compensate.go): attempts per effect, the backoff
	// before the second (doubled before each next one), and the bound
	// of one attempt; 0 takes DefaultCompensate*.
	CompensateAttempts int
	CompensateBackoff  time.Duration
	CompensateTimeout  time.Duration
	// OnLedgerAppend, if set, sees every record the ledger writes
	// (ledger.Ledger.OnAppend): the daemon's audit log.
	OnLedgerAppend func(ledger.Record)
}

// openEgress opens the ledger and prepares the host's egress; nothing
// changes on the host until a sandbox with egress runs.
func (m *Manager) openEgress() error {
	l, err := ledger.OpenSealed(m.path("ledger"), m.vault)
	if err != nil {
		return fmt.Errorf("effect ledger: %w", err)
	}
	m.ledger = l
	l.OnAppend(m.cfg.Egress.OnLedgerAppend)
	for sb, err := range l.Broken() {
		m.log.Error("effect ledger damaged: the sandbox records nothing and its egress sends nothing until it is removed", "sandbox", sb, "err", err)
	}
	for _, r := range l.Repairs() {
		m.log.Warn("effect ledger: cut a torn last record (a crash in the middle of an append)", "sandbox", r.Sandbox, "path", r.Path, "offset", r.Offset, "bytes", r.Bytes)
	}
	var roots *x509.CertPool
	if f := m.cfg.Egress.CAFile; f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("egress CA file: %w", err)
		}
		if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("egress CA file %s: no PEM certificate", f)
		}
	}
	m.net = egress.NewHost(egress.Config{
		ID: egress.HostID(m.cfg.Root), Range: m.cfg.Egress.Range, Uplink: m.cfg.Egress.Uplink,
		DNS: m.cfg.Egress.DNS, UpstreamRoots: roots, Ledger: l, Log: m.log,
	})
	// What a daemon that died left in the uplink namespace.
	if err := m.net.Cleanup(); err != nil {
		m.log.Warn("egress: cannot clean up after the last daemon", "err", err)
	}
	return nil
}

// closeEgress takes molt's network objects off the host.
func (m *Manager) closeEgress() {
	if m.net != nil {
		if err := m.net.Close(); err != nil {
			m.log.Warn("egress: cleanup", "err", err)
		}
	}
	if m.ledger != nil {
		_ = m.ledger.Close()
	}
}

func (m *Manager) egressFeature() meta.Feature {
	if err := m.net.Probe(); err != nil {
		return meta.Feature{Name: "egress", Reason: "cannot set up a router network namespace: " + err.Error()}
	}
	return meta.Feature{Name: "egress", Supported: true, Detail: m.net.Describe()}
}

// egressPolicy converts and checks a requested policy.
func egressPolicy(p *v1.EgressPolicy) (egress.Policy, error) {
	var out egress.Policy
	if p == nil {
		return out, out.Validate()
	}
	out = egress.Policy{
		AllowDomains: slices.Clone(p.AllowDomains), DenyDomains: slices.Clone(p.DenyDomains),
		HTTPPorts: slices.Clone(p.HTTPPorts), Inspect: p.Inspect, Divergence: egress.Divergence(p.OnDivergence),
		IgnoreHeaders: slices.Clone(p.IgnoreHeaders), IgnoreJSONFields: slices.Clone(p.IgnoreJSONFields),
	}
	for _, list := range []struct {
		in  []string
		out *[]netip.Prefix
	}{{p.AllowCIDRs, &out.AllowCIDRs}, {p.DenyCIDRs, &out.DenyCIDRs}} {
		for _, s := range list.in {
			pf, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return out, fmt.Errorf("egress cidr %q: want an address or a prefix such as 203.0.113.0/24", s)
				}
				pf = netip.PrefixFrom(a, a.BitLen())
			}
			*list.out = append(*list.out, pf)
		}
	}
	return out, out.Validate()
}

// setNetwork fills in rec's network and effect policy from a create
// request.
func setNetwork(rec *sandboxRec, req v1.SandboxCreateRequest) error {
	if err := ledger.CheckPolicy(req.EffectPolicy); err != nil {
		return err
	}
	if len(req.EffectPolicy) > 0 {
		rec.EffectPolicy = maps.Clone(req.EffectPolicy)
	}
	switch req.Network {
	case "", v1.NetworkNone:
		if req.Egress != nil {
			return fmt.Errorf("an egress policy needs network %q: %w", v1.NetworkEgress, errdefs.ErrInvalidArgument)
		}
		return nil
	case v1.NetworkEgress:
	default:
		return fmt.Errorf("network %q: want none or egress: %w", req.Network, errdefs.ErrInvalidArgument)
	}
	pol, err := egressPolicy(req.Egress)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	rec.Network = v1.NetworkEgress
	rec.Egress = &meta.Egress{Policy: pol}
	if pol.Inspect {
		ca, err := egress.NewCA("molt sandbox " + rec.ID)
		if err != nil {
			return err
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return err
		}
		rec.Egress.CACert, rec.Egress.CAKey = string(ca.CertPEM()), string(key)
		if rec.Env == nil {
			rec.Env = map[string]string{}
		}
		for k, v := range caEnv {
			if _, set := rec.Env[k]; !set {
				rec.Env[k] = v
			}
		}
	}
	return nil
}

// Where a sandbox with inspection finds molt's CA: the system bundle
// (which also gets it appended), and the CA alone for Node, which adds
// NODE_EXTRA_CA_CERTS to its own roots.
const (
	caBundle = "/etc/ssl/certs/ca-certificates.crt"
	caAlone  = "/usr/local/share/ca-certificates/molt-egress.crt"
)

var caEnv = map[string]string{
	"SSL_CERT_FILE": caBundle, "REQUESTS_CA_BUNDLE": caBundle, "PIP_CERT": caBundle,
	"CURL_CA_BUNDLE": caBundle, "NODE_EXTRA_CA_CERTS": caAlone,
}

// netJoin gives rec (a sandbox being made, with egress) an address
// unless it has one, makes it known to the host's egress, and writes its
// resolver and CA into its root. The returned undo forgets it.
func (m *Manager) netJoin(rec *sandboxRec) (func() error, error) {
	if rec.Network != v1.NetworkEgress || rec.Egress == nil {
		return func() error { return nil }, nil
	}
	if err := m.net.Probe(); err != nil {
		return nil, fmt.Errorf("egress is unsupported here: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if err := m.netRegister(rec); err != nil {
		return nil, err
	}
	id := rec.ID
	undo := func() error { return m.net.Remove(id) }
	if err := m.writeNetFiles(*rec); err != nil {
		_ = undo()
		return nil, err
	}
	return undo, nil
}

// netRegister gives rec an address of its own, unless it has one, and
// makes it known to the host's egress, under netMu so that two sandboxes
// being made at once never get the same address.
func (m *Manager) netRegister(rec *sandboxRec) error {
	m.netMu.Lock()
	defer m.netMu.Unlock()
	used := map[netip.Addr]bool{}
	sbs, err := meta.List[sandboxRec](m.db, meta.Sandboxes)
	if err != nil {
		return err
	}
	for _, s := range sbs {
		if s.Egress != nil && s.ID != rec.ID {
			used[s.Egress.Addr] = true
		}
	}
	for id, a := range m.net.Addrs() {
		if id != rec.ID {
			used[a] = true
		}
	}
	// A new sandbox, a fork (which comes with its parent's address),
	// or a sandbox from another host whose address is taken here or is
	// not in this host's range, gets an address of its own.
	if !m.net.Assignable(rec.Egress.Addr) || used[rec.Egress.Addr] {
		a, err := m.net.Alloc(used)
		if err != nil {
			return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
		}
		e := *rec.Egress
		e.Addr = a
		rec.Egress = &e
	}
	if err := m.net.Add(m.endpoint(*rec)); err != nil {
		return err
	}
	return nil
}

// writeNetFiles writes the sandbox's resolver and, with inspection, its
// CA into its root (resolving inside it: the sandbox's files are not to
// be trusted).
func (m *Manager) writeNetFiles(rec sandboxRec) error {
	root := m.sbRoot(rec.ID)
	return m.withHeadroom(rec, func() error {
		if err := sandbox.WriteFileIn(root, "/etc/resolv.conf", []byte("nameserver "+m.net.Gateway().String()+"\noptions edns0\n")); err != nil {
			return fmt.Errorf("write resolv.conf: %w", err)
		}
		if rec.Egress.CACert == "" {
			return nil
		}
		ca := []byte(rec.Egress.CACert)
		if err := sandbox.WriteFileIn(root, caAlone, ca); err != nil {
			return fmt.Errorf("install the sandbox's CA: %w", err)
		}
		bundle, err := sandbox.ReadFileIn(root, caBundle, 64<<20)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("install the sandbox's CA: %w", err)
		}
		if strings.Contains(string(bundle), strings.TrimSpace(rec.Egress.CACert)) {
			return nil
		}
		if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
			bundle = append(bundle, '\n')
		}
		if err := sandbox.WriteFileIn(root, caBundle, append(bundle, ca...)); err != nil {
			return fmt.Errorf("install the sandbox's CA: %w", err)
		}
		return nil
	})
}

// endpoint is what the proxy and DNS server know of rec.
func (m *Manager) endpoint(rec sandboxRec) *egress.Endpoint {
	id := rec.ID
	ep := &egress.Endpoint{ID: id, Addr: rec.Egress.Addr, Policy: rec.Egress.Policy,
		Turn: func() int { return m.turns.Current(id) },
		Head: func() string {
			var r sandboxRec
			if err := m.db.Get(meta.Sandboxes, id, &r); err != nil {
				return ""
			}
			return r.Head
		},
	}
	if rec.Egress.CACert != "" {
		if ca, err := egress.ParseCA([]byte(rec.Egress.CACert), []byte(rec.Egress.CAKey)); err == nil {
			ep.CA = ca
		} else {
			m.log.Warn("egress: the sandbox's CA is unreadable; TLS is not inspected", "sandbox", id, "err", err)
			ep.Policy.Inspect = false
		}
	}
	return ep
}

// netPrepare gives the network namespace a restore of rec's tree from
// ck will join a veth with rec's address, and ck's if it differs, for
// the restore (CRIU binds restored sockets to it).
func (m *Manager) netPrepare(rec sandboxRec, ck checkpointRec, netns *os.File) error {
	if rec.Network != v1.NetworkEgress || m.net == nil || !m.net.Known(rec.ID) {
		return nil
	}
	return m.net.Prepare(rec.ID, netns, ck.EgressAddr)
}

// prepareSpareNet is netPrepare for the network namespace of the
// spare CRIU pid.
func (m *Manager) prepareSpareNet(rec sandboxRec, ck checkpointRec, pid int) error {
	if rec.Network != v1.NetworkEgress || m.net == nil || !m.net.Known(rec.ID) {
		return nil
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	return m.net.Prepare(rec.ID, f, ck.EgressAddr)
}

// netActivate routes rec's address to the tree of init, now the
// sandbox's (see egress.Host.Activate).
func (m *Manager) netActivate(rec sandboxRec, init sandbox.Init) error {
	if rec.Network != v1.NetworkEgress || m.net == nil {
		return nil
	}
	if !m.net.Known(rec.ID) {
		if err := m.net.Add(m.endpoint(rec)); err != nil {
			return err
		}
	}
	return m.net.Activate(rec.ID, init.Pid)
}

// reconcileEgress, at start-up, gives the sandboxes with egress their
// network again (the router namespace went with the last daemon).
func (m *Manager) reconcileEgress(sbs []sandboxRec) {
	for _, s := range sbs {
		if s.Network != v1.NetworkEgress || s.Egress == nil {
			continue
		}
		if err := m.net.Add(m.endpoint(s)); err != nil {
			m.log.Warn("egress: sandbox has no network", "sandbox", s.ID, "err", err)
			continue
		}
		if s.State == v1.StateRunning && s.Init.Alive() {
			if err := m.net.Activate(s.ID, s.Init.Pid); err != nil {
				m.log.Warn("egress: sandbox has no network", "sandbox", s.ID, "err", err)
			}
		}
	}
}

// ledgerRewind moves rec's ledger head to where checkpoint ck was taken:
// what the sandbox recorded later is orphaned (the world has it, the
// sandbox's state does not).
func (m *Manager) ledgerRewind(id string, ck checkpointRec) {
	if err := m.ledger.Rewind(id, ck.LedgerHead); err != nil {
		m.log.Warn("effect ledger: cannot rewind", "sandbox", id, "checkpoint", ck.ID, "err", err)
	}
}

// egressCounts counts sandbox id's ledger records of turn n.
func (m *Manager) egressCounts(id string, n int) *meta.EgressCounts {
	if m.ledger == nil {
		return nil
	}
	rs, err := m.ledger.List(id, "")
	if err != nil {
		return nil
	}
	var c meta.EgressCounts
	seen := false
	for _, r := range rs {
		if r.Turn != n || r.Origin != "" {
			continue
		}
		seen = true
		switch r.State {
		case ledger.Denied:
			c.Denied++
			continue
		case ledger.Replayed:
			c.Replayed++
			continue
		case ledger.Blocked, ledger.Refused:
			c.Blocked++
			continue
		}
		switch r.Kind {
		case ledger.Read:
			c.Reads++
		case ledger.Effect:
			c.Effects++
		case ledger.Opaque:
			c.Opaque++
		}
		if p := r.Request.Proto; p == "http" || p == "https" || p == "tls" || p == "tcp" {
			c.Connections++
		}
	}
	if !seen {
		return nil
	}
	return &c
}

// rollbackPlan is what rolling rec back to ck does to its effects (nil
// when it orphans none and dryRun is off): the sandbox's effect policy
// decides, for each committed effect it would orphan, whether it is
// compensated, blocks the rollback, or is orphaned.
func (m *Manager) rollbackPlan(rec sandboxRec, ck checkpointRec, dryRun bool) (*meta.RollbackPlan, error) {
	orphans, err := m.ledger.WouldOrphan(rec.ID, ck.LedgerHead)
	if err != nil {
		return nil, fmt.Errorf("rollback %s to %s: %w", rec.ID, ck.ID, err)
	}
	if len(orphans) == 0 && !dryRun {
		return nil, nil
	}
	p := &meta.RollbackPlan{DryRun: dryRun}
	for _, r := range orphans {
		p.Orphan = append(p.Orphan, r.ID)
		d := ledger.Decide(rec.EffectPolicy, r)
		p.Decisions = append(p.Decisions, meta.EffectDecision{ID: r.ID, Kind: d.Kind, Policy: d.Policy, Action: d.Action, Reason: d.Reason})
		if r.State == ledger.Completed && r.Kind == ledger.Effect && r.Response != nil {
			p.Replay = append(p.Replay, r.ID)
		}
		switch d.Action {
		case ledger.ActCompensate:
			p.Compensate = append(p.Compensate, r.ID)
		case ledger.ActBlock:
			b := meta.BlockedEffect{ID: r.ID, Method: r.Request.Method, URL: r.Request.URL, Consumers: []string{}, Reason: d.Reason}
			for _, c := range r.Consumers {
				b.Consumers = append(b.Consumers, c.By)
			}
			p.Block = append(p.Block, b)
		}
	}
	return p, nil
}

// blocked is the conflict error of a plan with blocking effects.
func blocked(sb, ck string, p *meta.RollbackPlan) error {
	if p == nil || len(p.Block) == 0 {
		return nil
	}
	var l []string
	for _, b := range p.Block {
		what := strings.TrimSpace(b.Method + " " + b.URL)
		if what == "" {
			what = "effect"
		}
		why := b.Reason
		if len(b.Consumers) > 0 {
			why = "consumed by " + strings.Join(b.Consumers, ", ") + ": " + why
		}
		l = append(l, fmt.Sprintf("%s (%s) %s", b.ID, what, why))
	}
	return fmt.Errorf("rollback %s to %s would orphan %d effect(s) it may not: %s (--force to roll back anyway): %w",
		sb, ck, len(p.Block), strings.Join(l, "; "), errdefs.ErrConflict)
}

// EffectSandbox is the sandbox whose ledger holds effect id (its own
// record, not a fork's inherited copy).
func (m *Manager) EffectSandbox(id string) (string, bool) { return m.ledger.Find(id) }

// ConsumeEffect records that req.By acted on effect id.
func (m *Manager) ConsumeEffect(ctx context.Context, id string, req v1.EffectConsumeRequest) (ledger.Record, error) {
	sb, ok := m.ledger.Find(id)
	if !ok {
		return ledger.Record{}, fmt.Errorf("effect %s: %w", id, errdefs.ErrNotFound)
	}
	r, err := m.ledger.Consume(sb, id, ledger.Consumer{By: req.By, Note: req.Note})
	return m.effectView(r), err
}

// ledgerFork gives the fork rec a ledger branched from its checkpoint's
// sandbox's at the checkpoint; the returned undo removes it.
func (m *Manager) ledgerFork(rec sandboxRec) (func() error, error) {
	var ck checkpointRec
	if err := m.db.Get(meta.Checkpoints, rec.ForkedFrom, &ck); err != nil {
		return nil, fmt.Errorf("fork's ledger: checkpoint %s: %w", rec.ForkedFrom, err)
	}
	if err := m.ledger.Fork(ck.Sandbox, rec.ID, ck.LedgerHead); err != nil {
		return nil, fmt.Errorf("fork's ledger: %w", err)
	}
	id := rec.ID
	return func() error { return m.ledger.Remove(id) }, nil
}

// Effects lists sandbox ref's ledger, after checkpoint since when set.
func (m *Manager) Effects(ctx context.Context, ref, since string) ([]ledger.Record, map[string]bool, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return nil, nil, err
	}
	after := ""
	if since != "" {
		ck, err := m.lookupCheckpoint(since, rec.ID)
		if err != nil {
			return nil, nil, err
		}
		after = ck.LedgerHead
	}
	rs, err := m.ledger.List(rec.ID, after)
	if err != nil {
		return nil, nil, err
	}
	orphans := map[string]bool{}
	for _, o := range m.ledger.Orphans(rec.ID) {
		orphans[o.ID] = true
	}
	return m.effectViews(rs), orphans, nil
}

// DeclareEffect records an effect that did not cross molt's proxy.
func (m *Manager) DeclareEffect(ctx context.Context, ref string, req v1.EffectDeclareRequest) (ledger.Record, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return ledger.Record{}, err
	}
	kind := ledger.Kind(req.Kind)
	switch kind {
	case "":
		kind = ledger.Effect
	case ledger.Read, ledger.Effect, ledger.Opaque:
	default:
		return ledger.Record{}, fmt.Errorf("effect kind %q: want read, effect or opaque: %w", req.Kind, errdefs.ErrInvalidArgument)
	}
	state := ledger.State(req.State)
	switch state {
	case "":
		state = ledger.Completed
	case ledger.Completed, ledger.Failed, ledger.Pending:
	default:
		return ledger.Record{}, fmt.Errorf("effect state %q: want completed, failed or pending: %w", req.State, errdefs.ErrInvalidArgument)
	}
	var comp *ledger.Compensator
	if req.Compensator != nil {
		c := toLedgerCompensator(*req.Compensator)
		if err := ledger.ValidCompensator(&c); err != nil {
			return ledger.Record{}, err
		}
		comp = &c
	}
	if len(req.Type) > 64 || strings.Trim(strings.ToLower(req.Type), "abcdefghijklmnopqrstuvwxyz0123456789._-") != "" {
		return ledger.Record{}, fmt.Errorf("effect type %q: want [a-z0-9._-], at most 64: %w", req.Type, errdefs.ErrInvalidArgument)
	}
	if err := m.ledger.CheckDeps(rec.ID, req.DependsOn); err != nil {
		return ledger.Record{}, err
	}
	id := ledger.Identity{Proto: "declared", Method: strings.ToUpper(req.Method), URL: req.URL, Host: req.Host, IdempotencyKey: req.IdempotencyKey}
	if len(req.Body) > 0 {
		sum := sha256.Sum256(req.Body)
		id.BodyHash = hex.EncodeToString(sum[:])
	}
	r := ledger.Record{Kind: kind, State: state, Request: id, Declared: true, Type: strings.ToLower(req.Type),
		Turn: m.turns.Current(rec.ID), Checkpoint: rec.Head, Compensator: comp}
	if req.DependsOn != nil {
		deps := slices.Clone(req.DependsOn)
		r.DependsOn = &deps
	}
	if req.Status != 0 || len(req.ResponseBody) > 0 {
		r.Response = &ledger.Response{Status: req.Status, Body: req.ResponseBody, BodySize: int64(len(req.ResponseBody))}
	}
	r, err = m.ledger.Begin(rec.ID, r)
	return m.effectView(r), err
}

// adoptEgress checks that sandbox rec, adopted from the store, can have
// its egress here, and gives it its inspection CA's key from h (a
// migration's source hands it over; the store never holds it). Its
// address is given by netRegister.
func (m *Manager) adoptEgress(rec *sandboxRec, h *v1.Handover, signer string) error {
	if rec.Network != v1.NetworkEgress {
		return nil
	}
	if rec.Egress == nil {
		return fmt.Errorf("sandbox %s has egress, but the store's record of it does not say how (a record from an older molt): %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	if m.net == nil {
		return fmt.Errorf("sandbox %s has egress, which this daemon does not run: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	if err := m.net.Probe(); err != nil {
		return fmt.Errorf("sandbox %s has egress, which is unsupported here: %w: %w", rec.ID, err, errdefs.ErrFailedPrecondition)
	}
	e, err := handedOver(rec.ID, *rec.Egress, h)
	if err != nil {
		return err
	}
	names, err := m.handedNames(rec.ID, signer, h)
	if err != nil {
		return err
	}
	rec.Egress = &e
	m.net.Names().Import(rec.ID, names)
	return nil
}

// handedNames are the names sandbox id resolved on a migration's source,
// from its handover h, if the host that signed the sandbox's document
// in the store (signer) signed them.
func (m *Manager) handedNames(id, signer string, h *v1.Handover) ([]egress.Resolved, error) {
	if h == nil || len(h.Names) == 0 {
		return nil, nil
	}
	if h.NamesKey != signer {
		return nil, fmt.Errorf("sandbox %s: the handed-over names are signed by %q, not by %s, which signed its document: %w", id, h.NamesKey, signer, errdefs.ErrInvalidArgument)
	}
	sig := ckstore.Signature{Key: h.NamesKey, Sig: h.NamesSignature}
	if err := m.cks.Keyring().CheckBytes(sig, namesSigned(id, h.Names)); err != nil {
		return nil, fmt.Errorf("sandbox %s: the handed-over names: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	out := make([]egress.Resolved, 0, len(h.Names))
	for _, n := range h.Names {
		a, err := netip.ParseAddr(n.Addr)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: handed-over name %s: %v: %w", id, n.Name, err, errdefs.ErrInvalidArgument)
		}
		out = append(out, egress.Resolved{Name: n.Name, Addr: a, Expires: n.Expires})
	}
	return out, nil
}

// handedOver is egress e of sandbox id, adopted from the store, with its
// inspection CA's private key from h, which must match e's certificate
// (the signed record's); e unchanged without inspection.
func handedOver(id string, e meta.Egress, h *v1.Handover) (meta.Egress, error) {
	if e.CACert == "" {
		return e, nil
	}
	if h == nil || h.EgressCAKey == "" {
		return e, fmt.Errorf("sandbox %s inspects its TLS with a CA whose private key stayed with the host that offloaded it: move it with molt migrate, which hands the key over, or resume it there: %w", id, errdefs.ErrFailedPrecondition)
	}
	if _, err := egress.ParseCA([]byte(e.CACert), []byte(h.EgressCAKey)); err != nil {
		return e, fmt.Errorf("sandbox %s: the handed-over key of its inspection CA: %v: %w", id, err, errdefs.ErrInvalidArgument)
	}
	e.CAKey = h.EgressCAKey
	return e, nil
}
