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
