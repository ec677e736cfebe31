package httpapi

import (
	"net/http"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/keys"
)

// DataKeys is what the key endpoints need of the engine.
type DataKeys interface {
	DataKeys() ([]keys.KeyInfo, error)
	RotateDataKey(tenant string) (keys.KeyInfo, error)
	ShredDataKeys(tenant string) (int, error)
}

// KeyRoutes are the host admin's endpoints for the tenants' data keys
// of encryption at rest (served beside the API, so the admin's only).
func KeyRoutes(k DataKeys) []Route {
	toV1 := func(i keys.KeyInfo) v1.DataKey { return v1.DataKey(i) }
	return []Route{
		{"GET /v1/keys", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l, err := k.DataKeys()
			reply(w, mapSlice(l, toV1), err)
		})},
		{"POST /v1/keys/rotate", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req v1.DataKeyRequest
			if err := decode(w, r, &req); err != nil {
				writeError(w, err)
				return
			}
			i, err := k.RotateDataKey(req.Tenant)
			reply(w, toV1(i), err)
		})},
		{"POST /v1/keys/shred", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req v1.DataKeyRequest
			if err := decode(w, r, &req); err != nil {
				writeError(w, err)
				return
			}
			n, err := k.ShredDataKeys(req.Tenant)
			reply(w, v1.ShredResult{Tenant: req.Tenant, Shredded: n}, err)
		})},
	}
}
