// Package image makes the root filesystem trees that sandboxes run on.
//
// A tree comes from a tar stream (plain or gzip-compressed), from another
// directory, or from debootstrap (Build), whose results are cached as tar
// files keyed by the build options (CacheKey). Every path produces the same
// thing: an existing empty directory filled with the tree, with contents,
// modes (setuid, setgid and sticky included), mtimes, xattrs and hard links
// preserved, and ownership too when the caller may chown (root). A failed
// import leaves what it wrote in dst; the caller removes dst.
//
// # Import is a security boundary
//
// Archives and source trees are untrusted. The rules, checked per entry,
// fail the whole import with an error wrapping errdefs.ErrInvalidArgument
// that names the entry and the rule:
//
//   - absolute names and names with a ".." component are refused; a
//     leading "./" is fine ("./" itself is the root directory);
//   - character and block devices are refused: molt provides a sandbox's
//     device nodes itself, and a node in an image would give the sandbox
//     access to whatever host device it names;
//   - a hard link must name an earlier, non-directory entry by a relative
//     name without "..";
//   - a relative symlink may not point above the root, resolved lexically
//     from the link's directory ("a/b -> ../../x" is refused). Absolute
//     targets are allowed: they resolve inside the sandbox's root at run
//     time, and Debian trees have many;
//   - a file may replace a non-directory, never a directory;
//   - a tar stream must end with its end-of-archive marker, so a cut
//     stream is not taken for a smaller tree.
//
// The checks on names are not what keeps writes inside the destination; the
// kernel is. Each entry's parent is opened with openat2 and
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS from a
// descriptor of the destination, and the entry is created there with
// O_EXCL|O_NOFOLLOW, mkdirat, symlinkat or linkat, and changed only through
// descriptors or *at calls that do not follow symlinks. So an archive that
// plants "link -> /etc" and then writes "link/passwd" fails ("goes through
// a symlink") instead of writing outside, whether the symlink came from the
// archive or was already there. Directory modes and times are applied once
// the import is done, so later entries neither change a directory's mtime
// nor meet a read-only directory.
//
// # OCI and Docker images
//
// An Image (OpenRegistry, OpenArchive: a docker-save archive, an OCI
// layout or a tar of one, told apart by Detect) is unpacked by applying
// its layers in order with the same extractor, so every rule above holds
// for every layer. On top of them (layers.go): ".wh.NAME" deletes NAME
// from the layers below, walking directory descriptors without following
// symlinks, and NAME may not be empty, "." or ".."; ".wh..wh..opq"
// empties its directory of what lower layers put there, once the whole
// layer is written; an entry may replace a directory a lower layer left
// (not one of its own layer); a hard link may name a lower layer's file;
// directory modes and times are applied after the last layer. Each
// layer's uncompressed stream must hash to its diff ID in the config,
// the config to the manifest's digest of it (a registry's or a layout's
// image), and sizes are bounded before they are read (MaxManifestBytes,
// MaxConfigBytes, MaxLayers); a mismatch or an excess wraps
// errdefs.ErrInvalidArgument. Push writes a tree as one deterministic
// layer (walk order, mtimes kept) with a config. docs/images.md has the
// whole story.
//
// # Build
//
// Build runs debootstrap in a private mount namespace, so whatever it
// mounts in the target (proc, sys) disappears with it even when it fails,
// and cancelling ctx kills its whole process group. It then empties /dev
// (see above), drops downloaded .deb files and apt lists, and writes the
// cache file atomically (temporary file, fsync, rename), so a failed or
// interrupted Build never leaves a partial cache file. A failed Build
// leaves dst for the caller to remove.
//
// This package never logs; it returns errors, and Build writes debootstrap's
// output and its own progress lines to BuildOptions.Log.
package image
