// Package httpapi serves molt's versioned REST API (/v1) over HTTP. Each
// handler decodes the request, calls the Engine (core.Manager in the
// daemon; Engine is the handlers' view of it, declared here so the
// handlers are tested against a fake without root) and encodes the
// result, converted from the engine's domain types (internal/meta) to
// api/v1's in convert.go, the one place the two meet; error kinds are mapped to HTTP status codes here and nowhere
// else, under the names of api/v1's ErrKind constants. The endpoints are
// documented in docs/api.md.
package httpapi
