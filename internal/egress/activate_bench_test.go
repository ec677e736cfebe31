package egress

import (
	"net/netip"
	"os"
	"testing"

	"github.com/molt-sh/molt/internal/ns"
)

// BenchmarkActivate is a hot rollback's share of egress: a standby's
// namespace, prepared ahead, becomes the sandbox's (its route switches
// and the replaced tree's veth goes).
func BenchmarkActivate(b *testing.B) {
	_, upPath := world(b)
	h := NewHost(Config{ID: "b0", Uplink: upPath})
	defer h.Close()
	if err := h.Add(&Endpoint{ID: "sb", Addr: netip.MustParseAddr("10.201.0.9")}); err != nil {
		b.Fatal(err)
	}
	var live *os.File
	for b.Loop() {
		b.StopTimer()
		next, err := ns.NewNet()
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Prepare("sb", next, netip.Addr{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := h.ActivateNS("sb", next); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if live != nil {
			live.Close()
		}
		live = next
		b.StartTimer()
	}
	if live != nil {
		live.Close()
	}
}
