// Typed errors of the molt API.
//
// Every error the daemon reports has a kind (the `kind` member of the
// error body `{"kind", "message"}`, docs/api.md); each kind has its class
// here, all under MoltError, so a caller catches what it can handle:
//
//   try { await c.inspectSandbox("nope") }
//   catch (e) { if (!(e instanceof NotFound)) throw e }
//
// The kinds are those of api/v1/errors.go. `method_not_allowed` is the
// caller's mistake and is a MethodNotAllowed, a subclass of
// InvalidArgument (as the Go client maps it to ErrInvalidArgument).

/** Base class of every error this package throws. */
export class MoltError extends Error {
  static kind = "unknown";

  /**
   * @param {string} message
   * @param {{kind?: string, status?: number, candidates?: string[], cause?: unknown}} [opts]
   */
  constructor(message, opts = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    /** @type {string} */
    this.kind = opts.kind ?? /** @type {typeof MoltError} */ (this.constructor).kind;
    this.name = this.constructor.name;
    this.status = opts.status ?? 0;
    this.candidates = [...(opts.candidates ?? [])];
  }
}

/** The sandbox, checkpoint, image, session or effect does not exist (404). */
export class NotFound extends MoltError {
  static kind = "not_found";
}

/** An object of that name already exists (409). */
export class AlreadyExists extends MoltError {
  static kind = "already_exists";
}

/** The request is malformed or breaks a rule of the API (400). */
export class InvalidArgument extends MoltError {
  static kind = "invalid_argument";
}

/** The path exists, but not for this method (405). */
export class MethodNotAllowed extends InvalidArgument {
  static kind = "method_not_allowed";
}

/** The object is not in a state that allows the request (412). */
export class FailedPrecondition extends MoltError {
  static kind = "failed_precondition";
}

/** The daemon cannot serve the request now (503). */
export class Unavailable extends MoltError {
  static kind = "unavailable";
}

/** This host cannot do it (501), e.g. a full checkpoint without CRIU. */
export class NotSupported extends MoltError {
  static kind = "not_supported";
}

/** No room left in the pool beyond the daemon's reserve (507). */
export class ResourceExhausted extends MoltError {
  static kind = "resource_exhausted";
}

/** The request would break what others rely on (409). */
export class Conflict extends MoltError {
  static kind = "conflict";
}

/** The TCP listener got no valid token (401). */
export class Unauthenticated extends MoltError {
  static kind = "unauthenticated";
}

/** The token's scopes do not allow the request (403). */
export class PermissionDenied extends MoltError {
  static kind = "permission_denied";
}

/** Any other failure of the daemon (500), or an answer that is not an error body. */
export class Internal extends MoltError {
  static kind = "internal";
}

/** The daemon could not be reached (no socket, refused, TLS failure). */
export class ConnectionFailed extends MoltError {
  static kind = "connection";
}

/** An exec stream broke or reported an error before the command's exit status. */
export class StreamError extends MoltError {
  static kind = "stream";
}

/** A command run with `check: true` exited non-zero; `result` says how. */
export class CommandFailed extends MoltError {
  static kind = "command_failed";

  /**
   * @param {string} message
   * @param {unknown} result
   */
  constructor(message, result) {
    super(message);
    this.result = result;
  }
}

/**
 * A rollback happened but some of its compensations failed: the world
 * still has those effects. `result` is the RollbackResult.
 */
export class CompensationFailed extends MoltError {
  static kind = "compensation_failed";

  /**
   * @param {string} message
   * @param {unknown} result
   */
  constructor(message, result) {
    super(message);
    this.result = result;
  }
}

/** @type {Map<string, typeof MoltError>} */
const BY_KIND = new Map(
  [NotFound, AlreadyExists, InvalidArgument, MethodNotAllowed, FailedPrecondition, Unavailable,
    NotSupported, ResourceExhausted, Conflict, Unauthenticated, PermissionDenied, Internal]
    .map((c) => [c.kind, c]),
);

/**
 * Returns the typed error for a non-2xx answer with `body`.
 *
 * A body that is not an error object becomes Internal with the status and
 * the body's text, as the Go client does; an unknown kind (a newer
 * daemon's) becomes a plain MoltError with that kind.
 *
 * @param {number} status
 * @param {Uint8Array | string} body
 * @param {string} [reason]
 * @returns {MoltError}
 */
export function errorFromBody(status, body, reason = "") {
  const text = typeof body === "string" ? body : Buffer.from(body).toString("utf8");
  /** @type {any} */
  let data;
  try {
    data = JSON.parse(text);
  } catch {
    data = undefined;
  }
  const kind = data?.kind;
  const message = data?.message;
  if (typeof message !== "string" || !message || typeof kind !== "string") {
    const shown = text.slice(0, 4096).trim();
    return new Internal(`daemon answered ${status} ${reason}: ${shown}`.replace("  ", " "), { status });
  }
  const candidates = Array.isArray(data.candidates) ? data.candidates.map(String) : [];
  const Cls = BY_KIND.get(kind);
  if (Cls === undefined) {
    return new MoltError(message, { kind, status, candidates });
  }
  return new Cls(message, { status, candidates });
}
