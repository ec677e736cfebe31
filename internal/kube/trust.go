package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"

	kv1 "github.com/molt-sh/molt/api/kube/v1alpha1"
	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
)

// Trust between nodes: every agent reports its daemon's host key in its
// MoltNode's status (HostKey), and has its daemon trust the keys the
// other MoltNodes report. A sandbox suspended on one node is signed by
// that node's key; the node that resumes it must trust that key. Only a
// node's own agent may write its MoltNode's status (the admission
// policy), so a node is trusted by being in the node pool; trust is
// never taken back (what a node signed stays in the store after it
// leaves).

// trustPeers has the daemon, whose host is h, trust the host keys of
// the other MoltNodes nodes that it does not trust yet. A key that is
// not one is reported, and the others are still trusted.
func (a *Agent) trustPeers(ctx context.Context, h v1.Host, nodes []kv1.MoltNode) error {
	var errs []error
	for _, n := range nodes {
		key := n.Status.HostKey
		if n.Name == a.Node || key == "" {
			continue
		}
		pub, err := ckstore.DecodePublicKey([]byte(key))
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s's host key: %w", n.Name, err))
			continue
		}
		if slices.Contains(h.TrustedKeys, ckstore.KeyID(pub)) {
			continue
		}
		if _, err := a.Daemon.TrustKey(ctx, key); err != nil {
			errs = append(errs, fmt.Errorf("trust node %s's host key: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}
