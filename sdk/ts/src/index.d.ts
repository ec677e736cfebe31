// Types of @molt-sh/molt, the SDK of molt's REST API (docs/api.md).
//
// Written by hand next to the JavaScript it describes (src/*.js, which
// refers to these types in its JSDoc); `tsc -p sdk/ts` checks both, and
// test/types.ts uses the surface as a TypeScript program would.
//
// Answers are the API's JSON objects as the daemon sends them (snake_case
// members, api/v1/types.go); every interface allows members newer than
// this package. Options are camelCase.

/// <reference types="node" />

import type { Duplex } from "node:stream";

export const VERSION: string;
export const DEFAULT_SOCKET: string;
export const MAX_FRAME: number;
export const UPGRADE_PROTOCOL: string;

/** A reference: an ID, unique ID prefix, name or label, or any object with an `id`. */
export type Ref = string | { readonly id: string };

// -- errors ---------------------------------------------------------------

export interface MoltErrorOptions {
  kind?: string;
  status?: number;
  candidates?: string[];
  cause?: unknown;
}

/** Base class of every error this package throws. */
export class MoltError extends Error {
  static kind: string;
  constructor(message: string, opts?: MoltErrorOptions);
  /** The API error kind ("not_found", ...), or the client side's ("connection", "stream", ...). */
  kind: string;
  /** The HTTP status of the answer (0 when there was none). */
  status: number;
  /** For an ambiguous reference: references that each name one of the objects it matched. */
  candidates: string[];
}
export class NotFound extends MoltError {}
export class AlreadyExists extends MoltError {}
export class InvalidArgument extends MoltError {}
export class MethodNotAllowed extends InvalidArgument {}
export class FailedPrecondition extends MoltError {}
export class Unavailable extends MoltError {}
export class NotSupported extends MoltError {}
export class ResourceExhausted extends MoltError {}
export class Conflict extends MoltError {}
export class Unauthenticated extends MoltError {}
export class PermissionDenied extends MoltError {}
export class Internal extends MoltError {}
export class ConnectionFailed extends MoltError {}
export class StreamError extends MoltError {}
export class CommandFailed extends MoltError {
  constructor(message: string, result: unknown);
  /** The ExecResult or SessionResult of the command. */
  result: unknown;
}
export class CompensationFailed extends MoltError {
  constructor(message: string, result: unknown);
  /** The RollbackResult (its `compensation` says which failed and why). */
  result: unknown;
}
export function errorFromBody(status: number, body: Uint8Array | string, reason?: string): MoltError;

// -- the API's objects ----------------------------------------------------

interface Open {
  [member: string]: unknown;
}

export interface Feature extends Open {
  name: string;
  supported: boolean;
  detail?: string;
  reason?: string;
}

export interface HostInfo extends Open {
  version: string;
  kernel: string;
  root: string;
  pool: { dir: string; loop: boolean; size_bytes: number; free_bytes: number; node_size: number } & Open;
  cgroup: string;
  features: Feature[];
  sandboxes: number;
  started: string;
}

export interface Image extends Open {
  name: string;
  source: string;
  created: string;
  size_bytes?: number;
}

export interface Resources extends Open {
  memory_bytes?: number;
  pids?: number;
  cpu_millis?: number;
  io_weight?: number;
  standby_budget_bytes?: number;
  disk_bytes?: number;
}

export interface Session extends Open {
  name: string;
  pid: number;
  alive: boolean;
}

export interface CompensationReport extends Open {
  checkpoint: string;
  state: string;
  compensated?: string[];
  failed?: { id: string; attempts?: number; error: string }[];
  at: string;
}

export interface SandboxInfo extends Open {
  id: string;
  name?: string;
  tenant?: string;
  image: string;
  hostname: string;
  /** creating, running, stopped, hibernated or lost (`reason` says why). */
  state: string;
  reason?: string;
  /** Hibernated with its checkpoint in the object store only (hibernate({offload: true})). */
  offloaded?: boolean;
  created: string;
  pid?: number;
  env_names?: string[];
  secrets?: string[];
  resources?: Resources;
  seccomp?: string;
  head?: string;
  forked_from?: string;
  standby?: string;
  standbys?: string[];
  sessions?: Session[];
  memory_bytes?: number;
  processes?: number;
  disk_used_bytes?: number;
  network?: string;
  address?: string;
  effect_policy?: Record<string, string>;
  compensation?: CompensationReport;
}

export interface Checkpoint extends Open {
  id: string;
  sandbox: string;
  parent?: string;
  /** fs or full. */
  kind: string;
  label?: string;
  created: string;
  stall_ms: number;
  duration_ms: number;
  bytes_written: number;
  image_bytes?: number;
  keep?: boolean;
  pending?: boolean;
  failed?: boolean;
  failed_reason?: string;
  data_key?: string;
  /** In the daemon's object store; offloaded: its local copy freed (fetched back by any restore). */
  in_store?: boolean;
  offloaded?: boolean;
  /** Set by checkpointTree(). */
  children?: Checkpoint[];
}

export interface RollbackPlan extends Open {
  dry_run?: boolean;
  orphan?: string[];
  replay?: string[];
  compensate?: string[];
  block?: ({ id: string; consumers: string[] } & Open)[];
  decisions?: ({ id: string; action: string } & Open)[];
}

export interface RollbackResult extends Open {
  sandbox: string;
  checkpoint: string;
  /** hot, warm, cold or restart. */
  tier: string;
  duration_ms: number;
  processes_restarted: boolean;
  note?: string;
  plan?: RollbackPlan;
  compensation?: CompensationReport;
}

export interface ForkResult extends Open {
  checkpoint: string;
  sandboxes: SandboxInfo[];
  duration_ms: number;
  forks_per_second: number;
  reseeded?: number;
}

export interface SessionResult extends Open {
  stdout: string;
  stderr: string;
  exit_code: number;
  timed_out?: boolean;
  truncated?: boolean;
  duration_ms: number;
  replayed?: boolean;
}

export interface TurnResult extends Open {
  sandbox: string;
  turn: number;
  /** none, fs or full. */
  decision: string;
  checkpoint: string | null;
  head?: string;
  reasons: string[];
  effects: Open;
  decide_ms: number;
  stall_ms?: number;
  duration_ms: number;
  pending?: boolean;
}

export interface TurnRecord extends TurnResult {
  prev?: string;
  incomplete?: boolean;
  started?: string;
  ended?: string;
  commands?: ({ command?: string; exit_code?: number } & Open)[];
  llm?: Open[];
}

export interface LLMEndpoint extends Open {
  sandbox: string;
  url: string;
  upstream: string;
  gate?: string;
  /** Only in the answer that set it. */
  token?: string;
}

export interface Compensator extends Open {
  method?: string;
  url?: string;
  header?: Record<string, string[]>;
  /** Bytes or text (sent base64); an Effect read back has it base64. */
  body?: Uint8Array | string;
  sandbox?: string;
  command?: string[];
}

export interface Effect extends Open {
  id: string;
  seq: number;
  sandbox: string;
  /** read, effect or opaque. */
  kind: string;
  state: string;
  method?: string;
  url?: string;
  host?: string;
  status?: number;
  orphan?: boolean;
  declared?: boolean;
  type?: string;
  compensator?: Compensator;
  depends_on?: string[];
  compensation?: Open;
  consumers?: ({ by: string; note?: string; at: string } & Open)[];
  started: string;
  finished?: string;
}

export interface RecoverResult extends Open {
  sandbox: string;
  checkpoint: string;
  turn: number;
  turns: number[];
  llm_calls: number;
  commands: number;
  bytes: number;
  rollback?: RollbackResult;
  dry_run?: boolean;
  note?: string;
}

export interface RecoveryStatus extends Open {
  sandbox: string;
  /** none, fast-forward, done or diverged. */
  state: string;
  checkpoint?: string;
  turn?: number;
  replayed: number;
  total: number;
  bytes: number;
  divergence?: Open;
}

export interface ChainVerification extends Open {
  checkpoint: string;
  ok: boolean;
  links: ({ id: string; parent?: string; key?: string; problem?: string } & Open)[];
  key: string;
  trusted: string[];
}

export interface Tenant extends Open {
  name: string;
  created: string;
}

export interface Token extends Open {
  id: string;
  tenant: string;
  scopes?: string[];
  sandboxes?: string[];
  note?: string;
  created: string;
  /** The secret, only when created. */
  token?: string;
}

export interface DataKey extends Open {
  tenant: string;
  id: string;
  kek?: string;
  current?: boolean;
  created: string;
}

export interface ShredResult extends Open {
  tenant: string;
  shredded: number;
}

export interface AuditVerifyResult extends Open {
  ok: boolean;
  entries: number;
  head?: string;
  anchor?: string;
  bad_seq?: number;
  problem?: string;
}

export function checkpointTree(checkpoints: Checkpoint[]): Checkpoint[];

// -- options --------------------------------------------------------------

export interface ClientOptions {
  /** The daemon's unix socket: $MOLT_SOCKET, else /run/molt/molt.sock. */
  socket?: string;
  /** https://HOST:PORT of a daemon's TLS listener ($MOLT_ENDPOINT). */
  endpoint?: string;
  /** A tenant's token for the endpoint ($MOLT_TOKEN). */
  token?: string;
  /** A PEM file of the CA that signed the endpoint's certificate ($MOLT_TLS_CA; default the system's roots). */
  tlsCA?: string;
  /** Bounds each request's connect and reads; none by default. Exec streams have no deadline. */
  timeoutMs?: number;
}

export interface BuildImageOptions {
  suite?: string;
  packages?: readonly string[];
  mirror?: string;
  force?: boolean;
  /** Each progress message of the build, as it arrives. */
  onProgress?: (message: string) => void;
}

export interface PullImageOptions {
  /** The image's name here; default the reference's last path part. */
  name?: string;
  /** Plain HTTP to the registry (a loopback registry gets it anyway). */
  insecure?: boolean;
  /** Replace an image of that name. */
  force?: boolean;
  onProgress?: (message: string) => void;
}

export interface PushImageOptions {
  insecure?: boolean;
  onProgress?: (message: string) => void;
}

export interface ImportCheckpointOptions extends ProgressOptions {
  /** The host admin's: the tenant that owns the imported checkpoint. */
  tenant?: string;
}

export interface CreateSandboxOptions {
  /** Default "debian". */
  image?: string;
  name?: string;
  hostname?: string;
  env?: Record<string, string>;
  /** Environment variables stored only sealed and never shown. */
  secrets?: Record<string, string>;
  /** 0 the daemon's default, -1 none. */
  resources?: Resources;
  /** default, unconfined or custom. */
  seccomp?: string;
  seccompProfile?: string;
  /** none or egress. */
  network?: string;
  egress?: Record<string, unknown>;
  recordLimit?: number;
  /** {kind: refuse, compensate or allow}. */
  effectPolicy?: Record<string, string>;
  tenant?: string;
  /** Members sent as given (fields newer than this package). */
  extra?: Record<string, unknown>;
}

export type Stdin =
  | undefined
  | boolean
  | string
  | Uint8Array
  | AsyncIterable<Uint8Array | string>
  | Iterable<Uint8Array | string>;

export interface ExecStreamOptions {
  /**
   * undefined gives the command /dev/null; a string, bytes or an
   * (async) iterable of them is fed to it; true lets the caller write it
   * (ExecStream.write, closeStdin).
   */
  stdin?: Stdin;
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  /** Kills the command at this age (exit 124). */
  timeoutMs?: number;
  /** An operator's command, kept out of the turn log. */
  aside?: boolean;
}

export interface ExecOptions extends ExecStreamOptions {
  /** Throw CommandFailed on a non-zero exit. */
  check?: boolean;
  /** Each output chunk, as it arrives. */
  onOutput?: (chunk: OutputChunk) => unknown;
}

export interface RunOptions {
  timeoutMs?: number;
  aside?: boolean;
  /** Throw CommandFailed on a non-zero exit. */
  check?: boolean;
}

/** One report of a long call's progress (docs/api.md, "Progress"). */
export interface Progress {
  /** The stage the operation is in. */
  message?: string;
  /** How far the stage is, in unit ("bytes", or a count when absent). */
  done?: number;
  /** The stage's size, when known. */
  total?: number;
  unit?: string;
}

export interface ProgressOptions {
  /** Receives the daemon's reports as they come; the call answers as without. */
  progress?: (p: Progress) => void;
}

export interface HibernateOptions extends ProgressOptions {
  /** Then put the checkpoint into the daemon's object store and free its local copy: resume here or on any daemon sharing the store. */
  offload?: boolean;
}

export interface CheckpointOptions extends ProgressOptions {
  /** fs (the default), full (with CRIU) or auto (ends the turn: answers a TurnResult). */
  kind?: "fs" | "full" | "auto";
  label?: string;
  /** A full checkpoint answers once committed, not right after its instant is captured. */
  wait?: boolean;
  /** Keep a standby of it for a hot rollback. */
  keep?: boolean;
}

export interface RollbackOptions {
  /** undefined for the fastest, "warm" or "cold". */
  tier?: string;
  /** Roll back past effects others consumed (else Conflict). */
  force?: boolean;
  /** Only report the plan. */
  dryRun?: boolean;
}

export interface ForkOptions extends ProgressOptions {
  /** Fork from this checkpoint instead of a new fs checkpoint. */
  checkpoint?: Ref;
  /** Fresh $RANDOM seeds for the forks' sessions. */
  reseed?: boolean;
}

export interface EndTurnOptions {
  label?: string;
  /** Path patterns whose changes do not matter. */
  ignore?: readonly string[];
  dryRun?: boolean;
}

export interface RecoverOptions {
  to?: Ref;
  force?: boolean;
  dryRun?: boolean;
}

export interface SetLLMOptions {
  listen?: string;
  expose?: boolean;
  /** response or exec. */
  gate?: string;
  /** Added to every forwarded call (the operator's API key). */
  header?: Record<string, string>;
  ignore?: readonly string[];
}

export interface DeclareEffectOptions {
  kind?: string;
  state?: string;
  method?: string;
  url?: string;
  host?: string;
  body?: Uint8Array | string;
  idempotencyKey?: string;
  status?: number;
  responseBody?: Uint8Array | string;
  compensator?: Compensator;
  type?: string;
  /** undefined: every earlier effect; []: none. */
  dependsOn?: readonly string[];
}

export interface CreateTokenOptions {
  scopes?: readonly string[];
  sandboxes?: readonly string[];
  note?: string;
}

// -- exec -----------------------------------------------------------------

export function encodeFrame(type: string, payload?: Uint8Array | string): Buffer;

export class FrameReader {
  constructor(source: AsyncIterable<Uint8Array>, head?: Uint8Array);
  next(): Promise<{ type: string; payload: Buffer } | undefined>;
}

export class OutputChunk {
  constructor(stream: "stdout" | "stderr", data: Buffer);
  readonly stream: "stdout" | "stderr";
  readonly data: Buffer;
  /** The bytes as UTF-8. */
  readonly text: string;
}

/** How a command ended; its members as the exit frame and SessionResult name them. */
export class ExecResult {
  constructor(init: Partial<ExecResult>);
  /** 128+N when killed by signal N, 124 at its timeout, 127 when not found. */
  exit_code: number;
  signal: string;
  timed_out: boolean;
  duration_ms: number;
  replayed: boolean;
  stdout: Buffer;
  stderr: Buffer;
  pid: number | undefined;
  args: string[];
  readonly ok: boolean;
  readonly stdoutText: string;
  readonly stderrText: string;
  /** Returns this if the command exited 0, else throws CommandFailed. */
  check(): ExecResult;
}

/**
 * A running command: `for await` it for its output, then read `result`.
 * Closing it before the command ends kills the command.
 */
export class ExecStream implements AsyncIterable<OutputChunk> {
  constructor(socket: Duplex, head: Buffer, args: readonly string[], stdin: Stdin);
  /** The command's PID inside the sandbox, once the daemon sent it. */
  pid: number | undefined;
  /** The exit status, once the command ended. */
  result: ExecResult | undefined;
  write(data: Uint8Array | string): Promise<void>;
  closeStdin(): Promise<void>;
  signal(signum: number): Promise<void>;
  [Symbol.asyncIterator](): AsyncGenerator<OutputChunk, void, void>;
  /** Reads to the end; the result with stdout and stderr collected. */
  wait(onOutput?: (chunk: OutputChunk) => unknown): Promise<ExecResult>;
  close(): void;
}

// -- client and sandbox ---------------------------------------------------

/** One molt daemon: its unix socket, or a TLS endpoint with a tenant's token. */
export class Client {
  constructor(opts?: ClientOptions | string);
  readonly address: string;
  close(): void;

  host(): Promise<HostInfo>;
  metrics(): Promise<string>;
  images(): Promise<Image[]>;
  image(name: string): Promise<Image>;
  buildImage(name: string, opts?: BuildImageOptions): Promise<Image>;
  importImage(name: string, path: string): Promise<Image>;
  pullImage(ref: string, opts?: PullImageOptions): Promise<Image>;
  pushImage(name: string, ref: string, opts?: PushImageOptions): Promise<Image>;
  commit(ref: Ref, name: string): Promise<Image>;
  exportCheckpoint(ref: Ref, dest: string | import("node:stream").Writable): Promise<number>;
  /** The import's report: `checkpoint` (forkable with forkCheckpoint), counts, versions. */
  importCheckpoint(src: string | import("node:stream").Readable, opts?: ImportCheckpointOptions): Promise<any>;
  removeImage(name: string): Promise<void>;

  createSandbox(opts?: CreateSandboxOptions): Promise<Sandbox>;
  sandbox(opts?: CreateSandboxOptions): Promise<Sandbox>;
  attach(ref: Ref): Promise<Sandbox>;
  sandboxes(): Promise<SandboxInfo[]>;
  inspectSandbox(ref: Ref): Promise<SandboxInfo>;
  removeSandbox(ref: Ref): Promise<void>;
  stop(ref: Ref): Promise<SandboxInfo>;
  start(ref: Ref): Promise<SandboxInfo>;
  hibernate(ref: Ref, opts?: HibernateOptions): Promise<SandboxInfo>;
  /** A hibernated sandbox into the object store, its local copy freed. */
  offload(ref: Ref, opts?: ProgressOptions): Promise<SandboxInfo>;
  resume(ref: Ref, opts?: ProgressOptions): Promise<SandboxInfo>;

  execStream(ref: Ref, args: readonly string[], opts?: ExecStreamOptions): Promise<ExecStream>;
  exec(ref: Ref, args: readonly string[], opts?: ExecOptions): Promise<ExecResult>;
  execDetached(ref: Ref, args: readonly string[], opts?: Omit<ExecStreamOptions, "stdin">): Promise<number>;
  sessionRun(ref: Ref, session: string, command: string, opts?: RunOptions): Promise<SessionResult>;
  sessionClose(ref: Ref, session: string): Promise<void>;

  checkpoint(ref: Ref, opts: CheckpointOptions & { kind: "auto" }): Promise<TurnResult>;
  checkpoint(ref: Ref, opts?: CheckpointOptions & { kind?: "fs" | "full" }): Promise<Checkpoint>;
  checkpoints(ref: Ref): Promise<Checkpoint[]>;
  checkpointTree(ref: Ref): Promise<Checkpoint[]>;
  inspectCheckpoint(checkpoint: Ref): Promise<Checkpoint>;
  deleteCheckpoint(checkpoint: Ref): Promise<void>;
  verifyCheckpoint(checkpoint: Ref): Promise<Checkpoint>;
  verifyChain(checkpoint: Ref): Promise<ChainVerification>;
  rollback(ref: Ref, checkpoint: Ref, opts?: RollbackOptions): Promise<RollbackResult>;
  fork(ref: Ref, n?: number, opts?: ForkOptions): Promise<ForkResult>;
  forkCheckpoint(checkpoint: Ref, n?: number, opts?: { reseed?: boolean } & ProgressOptions): Promise<ForkResult>;
  forks(ref: Ref, n?: number, opts?: ForkOptions): Promise<Forks>;

  endTurn(ref: Ref, opts?: EndTurnOptions): Promise<TurnResult>;
  turns(ref: Ref): Promise<TurnRecord[]>;
  recover(ref: Ref, opts?: RecoverOptions): Promise<RecoverResult>;
  recovery(ref: Ref): Promise<RecoveryStatus>;
  setLLM(ref: Ref, upstream: string, opts?: SetLLMOptions): Promise<LLMEndpoint>;
  llm(ref: Ref): Promise<LLMEndpoint>;
  removeLLM(ref: Ref): Promise<void>;

  effects(ref: Ref, since?: Ref): Promise<Effect[]>;
  declareEffect(ref: Ref, opts?: DeclareEffectOptions): Promise<Effect>;
  consumeEffect(effect: Ref, by: string, note?: string): Promise<Effect>;
  setCompensator(effect: Ref, compensator: Compensator): Promise<Effect>;

  auditExport(since?: number): Promise<Buffer>;
  auditVerify(): Promise<AuditVerifyResult>;
  createTenant(name: string): Promise<Tenant>;
  tenants(): Promise<Tenant[]>;
  deleteTenant(name: string): Promise<void>;
  createToken(tenant: string, opts?: CreateTokenOptions): Promise<Token>;
  tokens(tenant?: string): Promise<Token[]>;
  deleteToken(id: string): Promise<void>;
  dataKeys(): Promise<DataKey[]>;
  rotateDataKey(tenant?: string): Promise<DataKey>;
  shredDataKeys(tenant: string): Promise<ShredResult>;
}

/** One sandbox, and every operation on it. */
export class Sandbox {
  constructor(client: Client, info: SandboxInfo);
  /** Creates a sandbox (on `client`, default a Client from the environment). */
  static create(opts?: CreateSandboxOptions & { client?: Client }): Promise<Sandbox>;
  readonly client: Client;
  /** The sandbox as last reported. */
  info: SandboxInfo;
  readonly id: string;
  readonly name: string | undefined;
  readonly state: string;

  refresh(): Promise<SandboxInfo>;
  inspect(): Promise<SandboxInfo>;
  /** Deletes the sandbox and its checkpoints; one already gone is not an error. */
  remove(): Promise<void>;
  /** Runs `fn` with the sandbox, then removes it (whether fn returned or threw). */
  use<T>(fn: (sb: Sandbox) => Promise<T> | T): Promise<T>;
  stop(): Promise<SandboxInfo>;
  start(): Promise<SandboxInfo>;
  hibernate(opts?: HibernateOptions): Promise<SandboxInfo>;
  resume(opts?: ProgressOptions): Promise<SandboxInfo>;

  exec(args: readonly string[], opts?: ExecOptions): Promise<ExecResult>;
  execStream(args: readonly string[], opts?: ExecStreamOptions): Promise<ExecStream>;
  execDetached(args: readonly string[], opts?: Omit<ExecStreamOptions, "stdin">): Promise<number>;
  /** Shell text in a persistent session ("main" by default). */
  run(command: string, opts?: RunOptions & { session?: string }): Promise<SessionResult>;
  closeSession(session?: string): Promise<void>;

  checkpoint(label: string | undefined, opts: Omit<CheckpointOptions, "label"> & { kind: "auto" }): Promise<TurnResult>;
  checkpoint(label?: string, opts?: Omit<CheckpointOptions, "label"> & { kind?: "fs" | "full" }): Promise<Checkpoint>;
  commit(name: string): Promise<Image>;
  checkpoints(): Promise<Checkpoint[]>;
  checkpointTree(): Promise<Checkpoint[]>;
  rollback(checkpoint: Ref, opts?: RollbackOptions): Promise<RollbackResult>;
  /** `n` copies (from `checkpoint`, or a new fs checkpoint) as Sandbox handles. */
  fork(n?: number, opts?: ForkOptions): Promise<Forks>;

  endTurn(opts?: EndTurnOptions): Promise<TurnResult>;
  turns(): Promise<TurnRecord[]>;
  recover(opts?: RecoverOptions): Promise<RecoverResult>;
  recovery(): Promise<RecoveryStatus>;
  setLLM(upstream: string, opts?: SetLLMOptions): Promise<LLMEndpoint>;
  llm(): Promise<LLMEndpoint>;
  removeLLM(): Promise<void>;
  effects(since?: Ref): Promise<Effect[]>;
  declareEffect(opts?: DeclareEffectOptions): Promise<Effect>;
}

/** The sandboxes a fork made, iterable, with the fork's result. */
export class Forks implements Iterable<Sandbox> {
  constructor(client: Client, result: ForkResult);
  readonly result: ForkResult;
  readonly sandboxes: Sandbox[];
  readonly checkpoint: string;
  readonly length: number;
  [Symbol.iterator](): Iterator<Sandbox>;
  remove(): Promise<void>;
  use<T>(fn: (forks: Forks) => Promise<T> | T): Promise<T>;
}
