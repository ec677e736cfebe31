// molt: checkpoint, rollback and fork for AI-agent sandboxes.
//
// The JavaScript/TypeScript SDK of molt's REST API (docs/api.md), with no
// runtime dependency: Node's http over the daemon's unix socket, or https
// to a daemon's TLS listener with a tenant's token. Types: index.d.ts.

export { Client, checkpointTree } from "./client.js";
export { Sandbox, Forks } from "./sandbox.js";
export { DEFAULT_SOCKET } from "./http.js";
export {
  ExecResult, ExecStream, OutputChunk, FrameReader, encodeFrame, MAX_FRAME, UPGRADE_PROTOCOL,
} from "./exec.js";
export {
  MoltError, NotFound, AlreadyExists, InvalidArgument, MethodNotAllowed, FailedPrecondition,
  Unavailable, NotSupported, ResourceExhausted, Conflict, Unauthenticated, PermissionDenied,
  Internal, ConnectionFailed, StreamError, CommandFailed, CompensationFailed, errorFromBody,
} from "./errors.js";

export const VERSION = "0.1.0";
