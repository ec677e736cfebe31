package httpapi

import (
	"errors"
	"net/http"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/tenant"
)

// ExportErrorTrailer is the trailer an export whose bundle was cut
// after the response began names its error in (the bundle then lacks
// its seal, and an import refuses it anyway).
const ExportErrorTrailer = "Molt-Export-Error"

// startWriter is a response that starts (status 200, a tar stream) on
// its first write, so that an error before any byte is answered as an
// error.
type startWriter struct {
	w       http.ResponseWriter
	started bool
}

func (s *startWriter) Write(p []byte) (int, error) {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/x-tar")
		s.w.Header().Set("Trailer", ExportErrorTrailer)
		s.w.WriteHeader(http.StatusOK)
	}
	return s.w.Write(p)
}

var errEmptyExport = errors.New("export wrote nothing")

func (s *server) checkpointExport(w http.ResponseWriter, r *http.Request) {
	sw := &startWriter{w: w}
	_, err := s.m.ExportCheckpoint(r.Context(), r.PathValue("id"), sw)
	switch {
	case err == nil && !sw.started:
		writeError(w, errEmptyExport)
	case err != nil && !sw.started:
		writeError(w, err)
	case err != nil:
		w.Header().Set(ExportErrorTrailer, err.Error())
	}
}

// checkpointImport reads a bundle from the request's body (unbounded
// here: the engine bounds what it writes by the pool's free space). A
// tenant's token imports for its tenant; the host admin for the tenant
// the query names ("" none).
func (s *server) checkpointImport(w http.ResponseWriter, r *http.Request) {
	pr := tenant.Of(r.Context())
	owner := r.URL.Query().Get("tenant")
	if !pr.Admin {
		owner = pr.Tenant
	}
	res, err := s.m.ImportCheckpoint(r.Context(), r.Body, owner)
	reply(w, toCheckpointImport(res), err)
}

func toCheckpointImport(c meta.CheckpointImport) v1.CheckpointImport {
	return v1.CheckpointImport{
		Checkpoint: toCheckpoint(c.Checkpoint), Objects: c.Objects, ObjectBytes: c.ObjectBytes,
		FSEntries: c.FSEntries, FSBytes: c.FSBytes, Molt: c.Molt, CRIU: c.CRIU, DurationMS: c.DurationMS,
	}
}
