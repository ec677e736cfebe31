package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/ns"
)

// What the router's firewall refuses or forwards without the proxy
// (a destination the policy denies; UDP other than DNS) never reaches a
// socket of molt's: the rules log the first packet of each such flow to
// an nflog group, and this reader turns each into a ledger record.

const (
	nflogGroup  = 0x6d6c // "ml"
	prefixDeny  = "molt-deny"
	prefixUDP   = "molt-udp"
	markDenied  = 0x6d01
	nfnlSubsys  = 4 // NFNL_SUBSYS_ULOG
	nfulnlMsgPk = 0 // NFULNL_MSG_PACKET
	nfulnlMsgCf = 1 // NFULNL_MSG_CONFIG
	cfgCmd      = 1 // NFULA_CFG_CMD
	cfgMode     = 2 // NFULA_CFG_MODE
	cfgTimeout  = 3 // NFULA_CFG_TIMEOUT
	cfgQThresh  = 4 // NFULA_CFG_QTHRESH
	cmdBind     = 1 // NFULNL_CFG_CMD_BIND
	copyPacket  = 2 // NFULNL_COPY_PACKET
	attrPayload = 9
	attrPrefix  = 10
)

// flowLog reads the router's nflog group.
type flowLog struct {
	c *netlink.Conn
}

// openFlowLog binds the nflog group in the router namespace.
func openFlowLog(router *os.File) (*flowLog, error) {
	var c *netlink.Conn
	err := ns.Do(router, unix.CLONE_NEWNET, func() error {
		var err error
		c, err = netlink.Dial(unix.NETLINK_NETFILTER, nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nflog: %w", err)
	}
	send := func(attrs []netlink.Attribute) error {
		b, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			return err
		}
		hdr := []byte{unix.AF_UNSPEC, 0, 0, 0}
		binary.BigEndian.PutUint16(hdr[2:], nflogGroup)
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsys<<8 | nfulnlMsgCf), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(hdr, b...),
		})
		return err
	}
	// Bind the group, then ask for the first 64 bytes of each packet
	// (the IP and transport headers).
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, 64)
	mode[4] = copyPacket
	if err := send([]netlink.Attribute{{Type: cfgCmd, Data: []byte{cmdBind}}}); err != nil {
		c.Close()
		return nil, fmt.Errorf("nflog: bind group: %w", err)
	}
	// One packet per message, sent at once: records are not held back
	// by the kernel's batching.
	one := binary.BigEndian.AppendUint32(nil, 1)
	if err := send([]netlink.Attribute{{Type: cfgMode, Data: mode}, {Type: cfgQThresh, Data: one}, {Type: cfgTimeout, Data: one}}); err != nil {
		c.Close()
		return nil, fmt.Errorf("nflog: copy mode: %w", err)
	}
	return &flowLog{c: c}, nil
}

// flow is one logged packet's flow.
type flow struct {
	denied   bool
	proto    string
	src, dst netip.AddrPort
}

// run delivers each logged flow to fn until the log is closed.
func (l *flowLog) run(fn func(flow)) {
	for {
		msgs, err := l.c.Receive()
		if err != nil {
			var oe *netlink.OpError
			if errors.As(err, &oe) && errors.Is(oe.Err, unix.ENOBUFS) {
				continue // overrun: some flows go unrecorded
			}
			return
		}
		for _, m := range msgs {
			if f, ok := parseFlow(m); ok {
				fn(f)
			}
		}
	}
}

func (l *flowLog) Close() error { return l.c.Close() }

// parseFlow reads an NFULNL_MSG_PACKET; the kernel wrote it, but the
// packet inside came from a sandbox: every length is checked.
func parseFlow(m netlink.Message) (flow, bool) {
	if m.Header.Type != netlink.HeaderType(nfnlSubsys<<8|nfulnlMsgPk) || len(m.Data) < 4 {
		return flow{}, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return flow{}, false
	}
	var f flow
	var pkt []byte
	for ad.Next() {
		switch ad.Type() {
		case attrPrefix:
			f.denied = strings.HasPrefix(strings.TrimRight(string(ad.Bytes()), "\x00"), prefixDeny)
		case attrPayload:
			pkt = ad.Bytes()
		}
	}
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return flow{}, false
	}
	ihl := int(pkt[0]&0x0f) * 4
	if ihl < 20 || len(pkt) < ihl+4 {
		return flow{}, false
	}
	switch pkt[9] {
	case unix.IPPROTO_TCP:
		f.proto = "tcp"
	case unix.IPPROTO_UDP:
		f.proto = "udp"
	default:
		f.proto = fmt.Sprintf("ip-proto-%d", pkt[9])
	}
	src := netip.AddrFrom4([4]byte(pkt[12:16]))
	dst := netip.AddrFrom4([4]byte(pkt[16:20]))
	f.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(pkt[ihl:]))
	f.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(pkt[ihl+2:]))
	return f, true
}

// recordFlow writes a logged flow to the ledger of the sandbox it came
// from.
func (h *Host) recordFlow(f flow) {
	ep, ok := h.lookup(f.src.Addr())
	if !ok || h.cfg.Ledger == nil {
		return
	}
	r := ledger.Record{Kind: ledger.Opaque, State: ledger.Completed,
		Request: ledger.Identity{Proto: f.proto, Addr: f.dst.String(), Host: h.names.Lookup(ep.ID, f.dst.Addr())},
		Started: time.Now().UTC()}
	if ep.Turn != nil {
		r.Turn = ep.Turn()
	}
	if ep.Head != nil {
		r.Checkpoint = ep.Head()
	}
	if f.denied {
		r.State = ledger.Denied
		if ok, why := ep.Policy.AllowAddr(f.dst.Addr(), h.deniedPrefixes()...); !ok {
			r.Error = why
		} else {
			r.Error = fmt.Sprintf("%s to %v refused by the sandbox's egress policy", f.proto, f.dst)
		}
	}
	if _, err := h.cfg.Ledger.Begin(ep.ID, r); err != nil {
		h.log.Warn("egress: cannot record a flow", "sandbox", ep.ID, "err", err)
	}
}

func (h *Host) deniedPrefixes() []netip.Prefix {
	h.srvMu.RLock()
	defer h.srvMu.RUnlock()
	return h.srvDenied
}
