// Package httpapi serves molt's versioned REST API (/v1) over HTTP. Each
// handler decodes the request, calls the core Manager and encodes the
// result; error kinds are mapped to HTTP status codes here and nowhere
// else. The endpoints are documented in docs/api.md.
package httpapi
