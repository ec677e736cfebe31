// Package ckstore is the checkpoint artifact: the directory of one
// checkpoint, its manifest (format, encoding, the checks a manifest read
// back from disk must pass), its objects (CRIU's images and their page
// hashes, each with a size and a SHA-256), their verification, and the
// lineage page index that lets a checkpoint share the pages earlier ones
// hold.
//
// A Writer creates an artifact, stores CRIU's images into it through
// internal/pagestore (content-addressed pages, shared by reflink), and
// commits it by writing the manifest last: an artifact without a
// manifest is incomplete, never listed and never restored from. A
// Reader verifies an artifact (quick, trusting objects whose stamp has
// not changed since this process hashed them; or thorough, hashing
// everything) and opens it for restore, returning the paths CRIU reads.
// The Store owns the stamp cache. The engine (internal/core) keeps the
// locks, the metadata records and the commit points; it decides which
// objects a checkpoint has (its record lists them), and this package
// checks that the stored bytes are those.
//
// # The backend seam
//
// Backend is the interface to stored bytes: per checkpoint, create an
// artifact, put, open, stat and remove named objects, put and read the
// manifest, list artifacts, delete one. Local (one directory per
// checkpoint in the pool, on btrfs) is its only implementation today,
// and storetest is the conformance suite any backend must pass.
//
// The seam sits there, below manifest encoding and verification and
// above files, because that is where the bytes of a checkpoint leave
// molt's hands and everything above it is the same whatever holds them:
//
//   - Encryption at rest wraps a Backend: Put encrypts what it stores,
//     Open decrypts; hashes and sizes in the manifest stay those of the
//     plaintext, so verification is unchanged. (Sharing pages by reflink
//     then needs deterministic per-page encryption, or gives way.)
//   - Signing covers the manifest (PutManifest/Manifest): the manifest
//     lists every object's hash, so one signature over it covers the
//     artifact, and DecodeManifest is where an unsigned one is refused.
//   - An object-storage backend implements Backend with objects named
//     ID/NAME and commits by writing the manifest object last, as Local
//     does. It has no local directory (it is no LocalBackend): restoring
//     from it fetches the objects into a local artifact first, since
//     CRIU reads its images from a directory, and the file snapshot
//     (a btrfs subvolume, not an object) travels as a send stream.
//
// Paths are never trusted: IDs must be single path components, object
// names relative and clean, and Local opens objects beneath the
// checkpoint's directory without following links.
package ckstore
