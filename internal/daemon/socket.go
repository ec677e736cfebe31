package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// SocketAccess says who may use the daemon's socket. Root (uid 0) always
// may. With Group set the socket file is root:Group, mode 0660, and a
// peer whose primary or supplementary groups include Group may too;
// without it the socket is 0600. UIDs are further users let in (they
// still need the file's permission: a group, or their own ACL).
type SocketAccess struct {
	Group int // gid; -1 or 0 for none
	UIDs  []int
}

// ParseSocketGroup resolves a group name or numeric gid ("" for none: -1).
func ParseSocketGroup(s string) (int, error) {
	if s == "" {
		return -1, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 {
		return n, nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return -1, fmt.Errorf("socket group %q: %w", s, errdefs.ErrInvalidArgument)
	}
	return strconv.Atoi(g.Gid)
}

// Listen creates the API socket, open to root only (see ListenAccess).
func Listen(path string) (net.Listener, error) {
	return ListenAccess(path, SocketAccess{Group: -1}, nil)
}

// ListenAccess creates the API socket. A socket file left by a dead
// daemon is replaced; one that a live daemon serves is an error.
//
// The socket never exists at path with a wider mode than its final one:
// it is bound inside a fresh 0700 directory next to path (bind creates
// it with the process's umask, which is process-wide in Go and cannot be
// set around one call safely), given its owner and mode there, and only
// then renamed into place. Every connection is then checked with
// SO_PEERCRED against access (a copy of the socket bind-mounted or
// passed elsewhere does not let anyone else in); refused peers are
// logged to log (nil: discarded) and disconnected.
func ListenAccess(path string, access SocketAccess, log *slog.Logger) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("socket %s: a daemon is already serving it: %w", path, errdefs.ErrAlreadyExists)
	}
	priv, err := os.MkdirTemp(dir, ".molt-sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(priv)
	if err := os.Chmod(priv, 0o700); err != nil {
		return nil, err
	}
	tmp := filepath.Join(priv, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// The name changes below: the daemon removes path itself on close.
	ln.SetUnlinkOnClose(false)
	mode := os.FileMode(0o600)
	if access.Group > 0 {
		if err := os.Lchown(tmp, 0, access.Group); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket group: %w", err)
		}
		mode = 0o660
	}
	if err := os.Chmod(tmp, mode); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &peerListener{UnixListener: ln, path: path, access: access, log: log}, nil
}

// peerListener accepts only the connections whose peer SocketAccess lets in.
type peerListener struct {
	*net.UnixListener
	path   string
	access SocketAccess
	log    *slog.Logger
}

func (l *peerListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cred, err := peerCred(c)
		if err != nil {
			l.log.Warn("daemon socket: connection refused: cannot read its peer's credentials", "err", err)
			c.Close()
			continue
		}
		if why := l.access.refuse(cred); why != "" {
			l.log.Warn("daemon socket: connection refused", "reason", why, "pid", cred.Pid, "uid", cred.Uid, "gid", cred.Gid)
			c.Close()
			continue
		}
		return c, nil
	}
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, serr
}

// refuse says why a peer may not use the socket ("" if it may).
func (a SocketAccess) refuse(cred *unix.Ucred) string {
	uid := int(cred.Uid)
	if uid == 0 || slices.Contains(a.UIDs, uid) {
		return ""
	}
	if a.Group > 0 && (int(cred.Gid) == a.Group || inGroup(int(cred.Pid), a.Group)) {
		return ""
	}
	return fmt.Sprintf("uid %d is neither root nor allowed (--socket-group, --socket-uid)", uid)
}

// inGroup reports whether process pid has gid among its supplementary
// groups. The pid is the peer's at connect time; a peer that exited
// meanwhile is refused.
func inGroup(pid, gid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Groups:"); ok {
			for _, f := range strings.Fields(rest) {
				if n, err := strconv.Atoi(f); err == nil && n == gid {
					return true
				}
			}
		}
	}
	return false
}
