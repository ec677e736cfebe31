package httpapi

import (
	"context"
	"net/http"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/remote"
)

// ObjectStore is what the object store's endpoints need of the engine.
type ObjectStore interface {
	StoreGC(ctx context.Context, o remote.GCOptions) (remote.GCReport, error)
}

// StoreRoutes are the host admin's endpoints for the object store
// (served beside the API, so the admin's only).
func StoreRoutes(st ObjectStore) []Route {
	return []Route{
		{"POST /v1/store/gc", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req v1.StoreGCRequest
			if err := decode(w, r, &req); err != nil {
				writeError(w, err)
				return
			}
			rep, err := st.StoreGC(r.Context(), remote.GCOptions{Grace: req.Grace(), DryRun: req.DryRun})
			reply(w, rep, err)
		})},
	}
}

// KeyTruster is what the trusted-keys endpoint needs of the engine.
type KeyTruster interface {
	TrustKey(pemKey []byte) (id string, added bool, err error)
}

// TrustRoutes are the host admin's endpoints for the keys this host
// trusts: what another host signed (its checkpoints, its documents in
// the store) is accepted once its key is trusted.
func TrustRoutes(k KeyTruster) []Route {
	return []Route{
		{"POST /v1/host/trusted-keys", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req v1.TrustKeyRequest
			if err := decode(w, r, &req); err != nil {
				writeError(w, err)
				return
			}
			id, added, err := k.TrustKey([]byte(req.PublicKey))
			reply(w, v1.TrustedKey{KeyID: id, Added: added}, err)
		})},
	}
}
