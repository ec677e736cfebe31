// Package remote keeps checkpoints in an object store (internal/objstore:
// any S3-compatible server), so that they outlive the host that took
// them: a hibernated sandbox whose local copy was freed resumes from the
// store, on its own daemon or on another that shares the store, and a
// checkpoint whose local copy was evicted restores from it.
//
// # Layout, version 1 (docs/storage.md)
//
//	PREFIX/molt-store.json              {"layout": 1}: a reader refuses any other
//	PREFIX/packs/HH/SHA256              a pack: content-addressed chunks, back to back
//	PREFIX/packs/HH/SHA256.idx          its index: per chunk, its SHA-256 and length
//	PREFIX/checkpoints/ID.json          a checkpoint's recipe, signed by the host that uploaded it
//	PREFIX/sandboxes/ID.json            a sandbox offloaded to the store, signed likewise
//
// Content is stored once per store: an object is cut into chunks (a
// CRIU page image into its 4 KiB pages, the file tree at its entries'
// boundaries and every MiB within a file, anything else every MiB), a
// chunk whose SHA-256 the store's index knows is referenced where it
// already is, and only new chunks go into packs. A lineage of
// checkpoints that differ in a few pages therefore uploads each page
// once. A recipe lists, per object, the extents of packs that make it
// up; reading needs no index, only the recipe.
//
// Nothing read from the store is trusted: a recipe is bounded, decoded
// strictly, its names checked as a manifest's are, its extents checked
// against the sizes they claim, and its signature checked against the
// keys this host trusts before anything of it is used. What it leads to
// (each object's bytes) is then verified by the engine against the
// checkpoint's signed manifest, and the file tree against the recipe's
// SHA-256 of it, as it is extracted through the hardened extractor of
// internal/image.
package remote
