package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSOOriginalDst = 80

// originalDst returns where a connection redirected by nftables was
// going: getsockopt SO_ORIGINAL_DST on the accepted socket.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("original destination: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	local, _ := addrPort(c.LocalAddr())
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		var buf [28]byte // sockaddr_in6, the larger of the two
		level, opt := unix.SOL_IP, unix.SO_ORIGINAL_DST
		if local.Addr().Is6() && !local.Addr().Is4In6() {
			level, opt = unix.SOL_IPV6, ip6tSOOriginalDst
		}
		n := uint32(len(buf))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt),
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if e != 0 {
			serr = e
			return
		}
		port := binary.BigEndian.Uint16(buf[2:4])
		switch binary.NativeEndian.Uint16(buf[0:2]) {
		case unix.AF_INET:
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port)
		case unix.AF_INET6:
			ap = netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])), port)
		default:
			serr = errors.New("unexpected address family")
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	return ap, nil
}
