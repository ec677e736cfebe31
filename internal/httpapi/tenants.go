package httpapi

import (
	"net/http"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/tenant"
)

// TenantRoutes are the host admin's endpoints for tenants and their
// tokens (served beside the API, so the admin's only); owns says
// whether a tenant still owns sandboxes; deleted, if set, runs after a
// tenant is deleted (the engine shreds its data keys).
func TenantRoutes(st *tenant.Store, owns func(string) bool, deleted func(string) error) []Route {
	toToken := func(r meta.TokenRecord) v1.Token {
		return v1.Token{ID: r.ID, Tenant: r.Tenant, Scopes: r.Scopes, Sandboxes: r.Sandboxes, Note: r.Note, Created: r.Created}
	}
	return []Route{
		{"POST /v1/tenants", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req v1.TenantCreateRequest
			if err := decode(w, r, &req); err != nil {
				writeError(w, err)
				return
			}
			rec, err := st.CreateTenant(req.Name)
			reply(w, v1.Tenant(rec), err)
		})},
		{"GET /v1/tenants", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l, err := st.Tenants()
			reply(w, mapSlice(l, func(t meta.TenantRecord) v1.Tenant { return v1.Tenant(t) }), err)
		})},
		{"DELETE /v1/tenants/{name}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			name := r.PathValue("name")
			err := st.DeleteTenant(name, owns)
			if err == nil && deleted != nil {
				err = deleted(name)
			}
			reply(w, struct{}{}, err)
		})},
		{"POST /v1/tokens", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req v1.TokenCreateRequest
			if err := decode(w, r, &req); err != nil {
				writeError(w, err)
				return
			}
			secret, rec, err := st.CreateToken(req.Tenant, req.Scopes, req.Sandboxes, req.Note)
			tok := toToken(rec)
			tok.Secret = secret
			reply(w, tok, err)
		})},
		{"GET /v1/tokens", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l, err := st.Tokens(r.URL.Query().Get("tenant"))
			reply(w, mapSlice(l, toToken), err)
		})},
		{"DELETE /v1/tokens/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reply(w, struct{}{}, st.DeleteToken(r.PathValue("id")))
		})},
	}
}
