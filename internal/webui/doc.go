// Package webui serves molt's web view (molt daemon --ui): a page that
// shows the sandboxes, each one's checkpoint tree, turn log and effect
// ledger, kept up to date by server-sent events, with rollback, fork,
// delete and hibernate/resume behind a confirmation.
//
// The page is static (HTML, CSS and JS embedded in the binary, no
// external resource) and reads the daemon's own API, which this package
// serves in-process under /api/ as the host admin, for the routes the
// page needs only.
//
// It must not become a way around the daemon socket's permissions (root
// only, or the socket's group): the listener is loopback only unless
// Expose, and every request needs the random token made at Start. The
// URL the daemon prints (?token=...) trades the token for an HttpOnly,
// SameSite=Strict cookie; a request without the token or the cookie is
// answered 401. A state-changing call also needs POST or DELETE, the
// X-Molt-UI header (which no cross-origin page can send without a
// preflight this server never grants) and an Origin equal to the
// server's own (403 otherwise). The Host header is checked too (a DNS
// rebinding attack's name is refused), and the page may not be framed.
package webui
