// Package bundle reads and writes portable checkpoint bundles: one
// checkpoint, self-contained, as one tar stream that another molt
// daemon imports (docs/bundles.md has the format).
//
// A bundle holds, in this order: a header (format version, the molt and
// CRIU versions that wrote it, the facts of the host a restore depends
// on, the image the checkpoint was taken on), the checkpoint's manifest
// flattened (no parent: the bundle carries the checkpoint's whole
// state) and signed by the exporting host, the objects the manifest
// lists (CRIU's images, in plaintext), the file tree (entries under
// fs/, written by internal/image's walker), and a seal: digests of the
// header, the manifest and the file tree, signed by the same host.
//
// # Reading is a security boundary
//
// A bundle comes from elsewhere; Read trusts nothing in it. Entries must
// come in the order above with the names it expects; the header,
// manifest and seal are bounded in size before they are read; objects
// must be the manifest's, one flat name each under images/, each of the
// manifest's size (checked before a byte is copied) and hash (checked
// as it is copied), and together with the tree within Limits; the
// manifest's signature and the seal's must verify with a key the host
// trusts ("untrusted key NAME" otherwise); the tree is written through
// image.Extractor, which creates every entry beneath its destination
// with the kernel's help and refuses devices, escaping names and links;
// the stream must end with its end-of-archive marker right after the
// seal, so a cut bundle is not taken for a smaller one. Read writes only
// into the two directories it is given, which the caller removes when
// it fails. What the caller must still check (the host facts: see
// Options.Accept; CRIU's images as hostile input) it is handed before
// anything is accepted.
//
// This package never logs.
package bundle
