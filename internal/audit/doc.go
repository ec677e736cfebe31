// Package audit is molt's tamper-evident audit log: every API action and
// every effect-ledger record, appended to one hash-chained file of JSON
// lines under the daemon's state root (<root>/audit/audit.log).
//
// # Format
//
// Each line is one Entry, a JSON object whose last member is "hash":
//
//	{"seq":1,"time":"…","prev":"000…000","kind":"api",…,"hash":"<64 hex>"}\n
//
// seq counts 1, 2, … within the file, prev is the previous line's hash
// (64 zeros for seq 1) and hash is
//
//	hash = hex(SHA-256(unhex(prev) || body))
//
// where body is the line's exact bytes with the member `,"hash":"<64
// hex>"` removed: the line without its trailing newline and without its
// last 75 bytes (`,"hash":"`, 64 lower-case hex digits, `"}`), followed
// by "}". The hash covers the bytes as written, so a verifier needs no
// JSON canonicalization: it cuts the suffix, hashes, and parses body only
// to read seq and prev (and to refuse a body that carries a second
// "hash" member). A line is at most MaxLine bytes.
//
// # What is detected
//
// Verify detects an edited byte (the line's hash no longer matches, or
// the line no longer parses), a deleted or inserted line (a gap in seq or
// a prev that is not the previous hash) and reordered lines (the same).
// Rewriting the tail consistently after an edit or truncating it is not
// detectable from the file alone: the Anchor records the latest durable
// (seq, hash) in a second place, and a verification against it fails when
// the log does not hold that entry with that hash. The anchor is written
// after the log lines it names are on disk, so it never names an entry a
// crash could lose. It protects against a truncated or replaced log (a
// restored backup, a tool cutting the file, a partial copy), not against
// whoever can write both files: root on the host can rewrite the log and
// the anchor together. Exporting the head (molt audit verify prints it)
// to another system extends the protection to that moment.
//
// # Crashes and damage
//
// Every line is written with one write(2) on an O_APPEND descriptor, so
// a crash leaves at most the last line torn; Open cuts it (Repair says
// what it cut): nothing in it had been acknowledged. Any other damage
// (a line before the last that does not verify, or a log that does not
// reach its anchor) makes Open move the file aside as
// audit.log.damaged-<time> and start a new segment: a new chain whose
// first entry (kind "segment") names the file set aside and why. The
// chain never continues over damage.
//
// # Durability and concurrency
//
// Append returns once its entry is on disk (fdatasync); concurrent Appends
// share one fdatasync (group commit). The anchor is then brought to the
// synced head by a background store (pwrite and fdatasync of its file),
// ordered so it never goes back: it lags the log by one store, a few
// milliseconds, and an entry cut from the tail in that window is not
// detected. Sync and Close wait for both. AppendAsync writes the line at
// once and leaves the sync to a background flush a few milliseconds later:
// a daemon crash loses nothing written, a host crash may lose the last
// entries (the API's reads, and the effect ledger's records, which the
// ledger has synced itself).
//
// Locks: syncMu, then mu briefly to read the head; anchorMu, then syncMu
// briefly. mu is never held while waiting for another lock.
package audit
