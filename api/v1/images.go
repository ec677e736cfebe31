package v1

import "time"

// Image is a read-only root filesystem.
type Image struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`
	Created   time.Time `json:"created"`
	SizeBytes int64     `json:"size_bytes,omitempty"`
	// Config is an OCI or Docker image's config, as far as molt applies
	// it to the sandboxes made from the image.
	Config *ImageConfig `json:"config,omitempty"`
	// Parent is the image of the sandbox a committed image came from.
	Parent string `json:"parent,omitempty"`
	// Digest is the manifest digest of a pulled image, or of the
	// image a push just wrote.
	Digest string `json:"digest,omitempty"`
}

// ImageConfig is what a sandbox made from an image gets of its config:
// Env under the sandbox's own env (a create request's Env wins), and
// WorkingDir, User and Entrypoint+Cmd as the cwd, user and command of an
// exec that names none.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// ImagePullRequest pulls an OCI or Docker image from a registry.
// Credentials come from the daemon's docker config file.
type ImagePullRequest struct {
	Name string `json:"name"`
	// Ref is the image reference, e.g. "registry.example:5000/app:1".
	Ref string `json:"ref"`
	// Insecure talks plain HTTP to the registry (a registry on a
	// loopback address gets HTTP without it).
	Insecure bool `json:"insecure,omitempty"`
	// Force replaces an existing image of that name.
	Force bool `json:"force,omitempty"`
}

// ImagePushRequest pushes an image to a registry as one layer.
type ImagePushRequest struct {
	Ref      string `json:"ref"`
	Insecure bool   `json:"insecure,omitempty"`
}

// CommitRequest makes an image of a sandbox's files.
type CommitRequest struct {
	Name string `json:"name"`
}

// ImageBuildRequest asks for a Debian image made with debootstrap.
type ImageBuildRequest struct {
	Name     string   `json:"name"`
	Suite    string   `json:"suite,omitempty"`
	Packages []string `json:"packages,omitempty"`
	Mirror   string   `json:"mirror,omitempty"`
	// Force rebuilds even if the image exists (it is replaced).
	Force bool `json:"force,omitempty"`
}

// ImageImportRequest imports what is at Path, readable by the daemon: a
// root filesystem (a directory, or a tar, plain or gzip or zstd), a
// docker-save archive, or an OCI image layout (a directory or a tar).
type ImageImportRequest struct {
	Name string `json:"name"`
	Path string `json:"path"`
}
