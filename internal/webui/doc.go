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
// Expose, and every call of the page (/events, /api/) needs the random
// token made at Start, in the X-Molt-UI-Token header (401 otherwise).
// The URL the daemon prints (/?token=...) is redirected to /#token=...:
// the page keeps the token in its tab's session storage, scoped to the
// view's origin, port included. No cookie carries it, since a browser
// sends a cookie for 127.0.0.1 to every port of the host, another local
// user's web server included. A state-changing call also needs an
// Origin equal to the view's own (403 otherwise). The Host header is
// checked too (a DNS rebinding attack's name is refused), and the page
// may not be framed.
package webui
