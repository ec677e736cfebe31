package egress

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Endpoint is what the proxy and the DNS server know of the sandbox
// behind a source address. Its fields are read-only once published.
type Endpoint struct {
	ID     string
	Addr   netip.Addr // the sandbox's address on its veth
	Policy Policy
	CA     *CA // the sandbox's CA when Policy.Inspect
	// Turn and Head give the sandbox's current turn and head checkpoint,
	// recorded with each ledger record.
	Turn func() int
	Head func() string
	// Bypass is for benchmarks only: the sandbox's TCP is forwarded by
	// NAT straight to the uplink, without the proxy and unrecorded (the
	// baseline molt's proxy is measured against). Never set for a
	// sandbox of a user's.
	Bypass bool
}

// Names remembers which name each sandbox resolved to which address
// through molt's DNS, so that a connection to an address is judged (and
// recorded) by the name the sandbox asked for.
type Names struct {
	mu sync.Mutex
	// +checklocks:mu
	m map[string]map[netip.Addr]nameEntry
}

type nameEntry struct {
	name    string
	expires time.Time
}

// minNameTTL keeps a name for an address at least this long: programs
// cache answers longer than their TTL.
const minNameTTL = 10 * time.Minute

// Add records that sandbox sb resolved name to ips.
func (n *Names) Add(sb, name string, ips []netip.Addr, ttl time.Duration) {
	ttl = max(ttl, minNameTTL)
	exp := time.Now().Add(ttl)
	n.mu.Lock()
	defer n.mu.Unlock()
	by := n.of(sb)
	for _, ip := range ips {
		by[ip.Unmap()] = nameEntry{name: normDomain(name), expires: exp}
	}
}

// of returns sandbox sb's names, made if it has none.
//
// +checklocks:n.mu
func (n *Names) of(sb string) map[netip.Addr]nameEntry {
	if n.m == nil {
		n.m = make(map[string]map[netip.Addr]nameEntry)
	}
	by := n.m[sb]
	if by == nil {
		by = make(map[netip.Addr]nameEntry)
		n.m[sb] = by
	}
	return by
}

// Lookup returns the name sandbox sb last resolved to ip, or "".
func (n *Names) Lookup(sb string, ip netip.Addr) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.m[sb][ip.Unmap()]
	if !ok || time.Now().After(e.expires) {
		return ""
	}
	return e.name
}

// Copy gives sandbox to what from has (a fork resolved what its parent
// resolved).
func (n *Names) Copy(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	src := n.m[from]
	if len(src) == 0 {
		return
	}
	dst := make(map[netip.Addr]nameEntry, len(src))
	for k, v := range src {
		dst[k] = v
	}
	n.m[to] = dst
}

// Resolved is a name a sandbox resolved to an address, remembered until
// Expires.
type Resolved struct {
	Name    string
	Addr    netip.Addr
	Expires time.Time
}

// Export lists what sandbox sb resolved and is not expired, by address.
func (n *Names) Export(sb string) []Resolved {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	var out []Resolved
	for a, e := range n.m[sb] {
		if now.Before(e.expires) {
			out = append(out, Resolved{Name: e.name, Addr: a, Expires: e.expires})
		}
	}
	slices.SortFunc(out, func(x, y Resolved) int { return x.Addr.Compare(y.Addr) })
	return out
}

// Import gives sandbox sb what another host's DNS remembered of it (a
// migration's source): each entry until it expires, and never longer
// than minNameTTL from now; what sb resolved here stays.
func (n *Names) Import(sb string, rs []Resolved) {
	n.mu.Lock()
	defer n.mu.Unlock()
	by := n.of(sb)
	now := time.Now()
	for _, r := range rs {
		a := r.Addr.Unmap()
		if _, ok := by[a]; ok || !r.Addr.IsValid() || !now.Before(r.Expires) {
			continue
		}
		exp := r.Expires
		if limit := now.Add(minNameTTL); exp.After(limit) {
			exp = limit
		}
		by[a] = nameEntry{name: normDomain(r.Name), expires: exp}
	}
}

// Forget drops what sandbox sb resolved.
func (n *Names) Forget(sb string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.m, sb)
}
