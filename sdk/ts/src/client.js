// The client of molt's REST API (docs/api.md).

import { createReadStream, createWriteStream } from "node:fs";
import { pipeline } from "node:stream/promises";
import { CommandFailed, CompensationFailed, Internal, StreamError, errorFromBody } from "./errors.js";
import { ExecStream, UPGRADE_PROTOCOL } from "./exec.js";
import { Transport } from "./http.js";
import { Forks, Sandbox } from "./sandbox.js";

/** @typedef {import("./index.js").Ref} Ref */
/** @typedef {import("./index.js").ClientOptions} ClientOptions */
/** @typedef {import("./index.js").CreateSandboxOptions} CreateSandboxOptions */
/** @typedef {import("./index.js").ExecOptions} ExecOptions */
/** @typedef {import("./index.js").ExecStreamOptions} ExecStreamOptions */
/** @typedef {import("./index.js").Checkpoint} Checkpoint */
/** @typedef {import("./index.js").Compensator} Compensator */
/** @typedef {import("./index.js").DeclareEffectOptions} DeclareEffectOptions */
/** @typedef {import("./index.js").SetLLMOptions} SetLLMOptions */

/**
 * @param {string} s
 * @returns {string}
 */
const esc = (s) => encodeURIComponent(s);

/**
 * A reference from a string, an API object or a Sandbox handle (its id).
 *
 * @param {Ref} x
 * @returns {string}
 */
export function ref(x) {
  if (typeof x === "string") {
    if (!x) {
      throw new TypeError("empty reference");
    }
    return x;
  }
  const id = x !== null && typeof x === "object" ? /** @type {{id?: unknown}} */ (x).id : undefined;
  if (typeof id === "string" && id) {
    return id;
  }
  throw new TypeError("want a reference (ID, name, label) or an object with an id");
}

/**
 * A request body without the members left undefined, null or false (the
 * daemon's defaults apply to those).
 *
 * @param {Record<string, unknown>} kw
 * @returns {Record<string, unknown>}
 */
function body(kw) {
  /** @type {Record<string, unknown>} */
  const out = {};
  for (const [k, v] of Object.entries(kw)) {
    if (v !== undefined && v !== null && v !== false) {
      out[k] = v;
    }
  }
  return out;
}

/**
 * @param {Record<string, unknown> | undefined} m
 * @returns {Record<string, unknown> | undefined}
 */
const opt = (m) => (m && Object.keys(m).length ? { ...m } : undefined);

/**
 * Go encodes []byte members as base64.
 *
 * @param {Uint8Array | string | undefined} b
 * @returns {string | undefined}
 */
function b64(b) {
  if (b === undefined) {
    return undefined;
  }
  return (typeof b === "string" ? Buffer.from(b) : Buffer.from(b)).toString("base64");
}

/**
 * @param {Compensator | undefined} c
 * @returns {Record<string, unknown> | undefined}
 */
function compensator(c) {
  if (c === undefined) {
    return undefined;
  }
  /** @type {Record<string, unknown>} */
  const out = { ...c };
  if (typeof c.body === "string" || c.body instanceof Uint8Array) {
    out.body = b64(c.body);
  }
  return out;
}

/**
 * @param {number | undefined} ms
 * @returns {number | undefined}
 */
function timeout(ms) {
  if (ms === undefined) {
    return undefined;
  }
  if (!(ms >= 0)) {
    throw new RangeError("a timeout is not negative");
  }
  return Math.round(ms);
}

/**
 * Links a sandbox's checkpoints (oldest first) into their tree: each
 * gets `children` (oldest first), and the roots (no parent, or a parent
 * not in the list) are returned.
 *
 * @param {Checkpoint[]} checkpoints
 * @returns {Checkpoint[]}
 */
export function checkpointTree(checkpoints) {
  const byId = new Map(checkpoints.map((c) => [c.id, c]));
  /** @type {Checkpoint[]} */
  const roots = [];
  for (const c of checkpoints) {
    c.children = [];
  }
  for (const c of checkpoints) {
    const parent = byId.get(c.parent ?? "");
    (parent !== undefined ? /** @type {Checkpoint[]} */ (parent.children) : roots).push(c);
  }
  return roots;
}

/** One molt daemon. */
export class Client {
  /** @param {ClientOptions | string} [opts] the options, or the socket's path */
  constructor(opts = {}) {
    const o = typeof opts === "string" ? { socket: opts } : opts;
    /** @type {Transport} */
    this.t = new Transport(o);
  }

  /** The socket path or endpoint this client talks to. */
  get address() {
    return this.t.where();
  }

  /** Releases the client (it holds no connection between calls). */
  close() {}

  // -- host and images -------------------------------------------------

  host() {
    return this.t.call("GET", "/v1/host");
  }

  /** @returns {Promise<string>} */
  async metrics() {
    return (await this.t.raw("GET", "/v1/metrics")).toString("utf8");
  }

  async images() {
    return (await this.t.call("GET", "/v1/images")) ?? [];
  }

  /** @param {string} name */
  image(name) {
    return this.t.call("GET", "/v1/images/" + esc(name));
  }

  /**
   * @param {string} name
   * @param {import("./index.js").BuildImageOptions} [o]
   */
  async buildImage(name, o = {}) {
    const req = body({
      name, suite: o.suite, packages: o.packages?.length ? [...o.packages] : undefined,
      mirror: o.mirror, force: o.force,
    });
    return this.imageStream("image build", "/v1/images/build", req, o.onProgress);
  }

  /**
   * An image route's own stream of progress lines, ending with the image.
   *
   * @param {string} op
   * @param {string} path
   * @param {unknown} req
   * @param {((message: string) => void) | undefined} onProgress
   */
  async imageStream(op, path, req, onProgress) {
    for await (const p of this.t.lines("POST", path, req)) {
      if (p?.error) {
        throw errorFromBody(p.status || 200, JSON.stringify(p.error));
      }
      if (p?.image) {
        return p.image;
      }
      if (onProgress && typeof p?.message === "string" && p.message) {
        onProgress(p.message);
      }
    }
    throw new Internal(`${op}: the daemon closed the stream without a result`);
  }

  /**
   * Pulls an OCI or Docker image from a registry (the daemon reads its
   * credentials from its docker config file).
   *
   * @param {string} imageRef
   * @param {import("./index.js").PullImageOptions} [o]
   */
  pullImage(imageRef, o = {}) {
    const name = o.name ?? imageRef.split("/").pop()?.split("@")[0].split(":")[0] ?? imageRef;
    const req = body({ name, ref: imageRef, insecure: o.insecure, force: o.force });
    return this.imageStream("image pull", "/v1/images/pull", req, o.onProgress);
  }

  /**
   * Pushes image `name` to a registry as `imageRef`.
   *
   * @param {string} name
   * @param {string} imageRef
   * @param {import("./index.js").PushImageOptions} [o]
   */
  pushImage(name, imageRef, o = {}) {
    const req = body({ ref: imageRef, insecure: o.insecure });
    return this.imageStream("image push", `/v1/images/${esc(name)}/push`, req, o.onProgress);
  }

  /**
   * Makes image `name` of a sandbox's files.
   *
   * @param {Ref} r
   * @param {string} name
   */
  commit(r, name) {
    return this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/commit`, { name });
  }

  /**
   * Writes checkpoint `r` as a portable bundle (docs/bundles.md) to the
   * file `dest` (a path) or a writable stream; resolves to the bytes
   * written. A bundle cut short rejects with StreamError.
   *
   * @param {Ref} r
   * @param {string | import("node:stream").Writable} dest
   */
  async exportCheckpoint(r, dest) {
    const path = `/v1/checkpoints/${esc(ref(r))}/export`;
    const res = await this.t.open("GET", path, undefined, 0);
    const out = typeof dest === "string" ? createWriteStream(dest, { mode: 0o600 }) : dest;
    let n = 0;
    let tail = Buffer.alloc(0);
    res.on("data", (/** @type {Buffer} */ chunk) => {
      n += chunk.length;
      tail = Buffer.concat([tail, chunk]).subarray(-1024);
    });
    try {
      await pipeline(res, out);
    } catch (err) {
      throw new StreamError(`export ${ref(r)}: ${/** @type {Error} */ (err).message}`);
    }
    const failed = res.trailers["molt-export-error"];
    if (failed || tail.length < 1024 || tail.some((b) => b !== 0)) {
      throw new StreamError(`export ${ref(r)}: the bundle was cut short after ${n} bytes${failed ? ": " + failed : ""}`);
    }
    return n;
  }

  /**
   * Sends a bundle (a path or a readable stream) to the daemon, which
   * verifies it whole before listing its checkpoint (a new ID).
   *
   * @param {string | import("node:stream").Readable} src
   * @param {import("./index.js").ImportCheckpointOptions} [o]
   */
  importCheckpoint(src, o = {}) {
    const path = "/v1/checkpoints/import" + (o.tenant ? `?tenant=${esc(o.tenant)}` : "");
    const source = typeof src === "string" ? createReadStream(src) : src;
    return this.t.upload("POST", path, source, "application/x-tar", o.progress);
  }

  /**
   * @param {string} name
   * @param {string} path
   */
  importImage(name, path) {
    return this.t.call("POST", "/v1/images/import", { name, path });
  }

  /** @param {string} name */
  async removeImage(name) {
    await this.t.call("DELETE", "/v1/images/" + esc(name));
  }

  // -- sandboxes -------------------------------------------------------

  /** @param {CreateSandboxOptions} [o] */
  async createSandbox(o = {}) {
    const { image = "debian", env, secrets, resources, egress, effectPolicy, recordLimit, seccompProfile, extra, ...rest } = o;
    const req = body({
      ...extra, image, ...rest, env: opt(env), secrets: opt(secrets), resources: opt(resources),
      egress: opt(egress), effect_policy: opt(effectPolicy), record_limit: recordLimit,
      seccomp_profile: seccompProfile,
    });
    const info = await this.t.call("POST", "/v1/sandboxes", req);
    return new Sandbox(this, info);
  }

  /** @param {CreateSandboxOptions} [o] */
  sandbox(o) {
    return this.createSandbox(o);
  }

  /** @param {Ref} r */
  async attach(r) {
    return new Sandbox(this, await this.inspectSandbox(r));
  }

  async sandboxes() {
    return (await this.t.call("GET", "/v1/sandboxes")) ?? [];
  }

  /** @param {Ref} r */
  inspectSandbox(r) {
    return this.t.call("GET", "/v1/sandboxes/" + esc(ref(r)));
  }

  /** @param {Ref} r */
  async removeSandbox(r) {
    await this.t.call("DELETE", "/v1/sandboxes/" + esc(ref(r)));
  }

  /**
   * @param {Ref} r
   * @param {string} verb
   * @param {((p: import("./index.js").Progress) => void) | undefined} [progress]
   */
  lifecycle(r, verb, progress = undefined) {
    return this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/${verb}`, undefined, progress);
  }

  /** @param {Ref} r */
  stop(r) {
    return this.lifecycle(r, "stop");
  }

  /** @param {Ref} r */
  start(r) {
    return this.lifecycle(r, "start");
  }

  /**
   * @param {Ref} r
   * @param {import("./index.js").HibernateOptions} [o]
   */
  hibernate(r, o = {}) {
    return this.lifecycle(r, o.offload ? "hibernate?offload=true" : "hibernate", o.progress);
  }

  /**
   * @param {Ref} r
   * @param {import("./index.js").ProgressOptions} [o]
   */
  offload(r, o = {}) {
    return this.lifecycle(r, "offload", o.progress);
  }

  /**
   * @param {Ref} r
   * @param {import("./index.js").ProgressOptions} [o]
   */
  resume(r, o = {}) {
    return this.lifecycle(r, "resume", o.progress);
  }

  // -- exec and sessions -----------------------------------------------

  /**
   * @param {Ref} r
   * @param {readonly string[]} args
   * @param {ExecStreamOptions} [o]
   */
  async execStream(r, args, o = {}) {
    const a = args.map(String);
    if (!a.length) {
      throw new TypeError("exec: no command");
    }
    const stdin = o.stdin;
    const req = body({
      args: a, env: opt(o.env), cwd: o.cwd, user: o.user, timeout_ms: timeout(o.timeoutMs),
      stdin: stdin !== undefined && stdin !== false, aside: o.aside,
    });
    const { socket, head } = await this.t.upgrade(`/v1/sandboxes/${esc(ref(r))}/exec`, req, UPGRADE_PROTOCOL);
    return new ExecStream(socket, head, a, stdin === false ? undefined : stdin);
  }

  /**
   * @param {Ref} r
   * @param {readonly string[]} args
   * @param {ExecOptions} [o]
   */
  async exec(r, args, o = {}) {
    if (o.stdin === true) {
      throw new TypeError("exec: stdin: true needs execStream");
    }
    const s = await this.execStream(r, args, o);
    let res;
    try {
      res = await s.wait(o.onOutput);
    } finally {
      s.close();
    }
    return o.check ? res.check() : res;
  }

  /**
   * @param {Ref} r
   * @param {readonly string[]} args
   * @param {Omit<ExecStreamOptions, "stdin">} [o]
   * @returns {Promise<number>}
   */
  async execDetached(r, args, o = {}) {
    const req = body({
      args: args.map(String), env: opt(o.env), cwd: o.cwd, user: o.user,
      timeout_ms: timeout(o.timeoutMs), detach: true, aside: o.aside,
    });
    return Number((await this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/exec`, req)).pid);
  }

  /**
   * @param {Ref} r
   * @param {string} session
   * @param {string} command
   * @param {import("./index.js").RunOptions} [o]
   */
  async sessionRun(r, session, command, o = {}) {
    const req = body({ command, timeout_ms: timeout(o.timeoutMs), aside: o.aside });
    const res = await this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/sessions/${esc(session)}/run`, req);
    res.exit_code = res.exit_code ?? 0;
    if (o.check && res.exit_code !== 0) {
      const err = String(res.stderr ?? "").trim().slice(-500);
      throw new CommandFailed(`session ${session}: ${JSON.stringify(command)} exited ${res.exit_code}: ${err}`, res);
    }
    return res;
  }

  /**
   * @param {Ref} r
   * @param {string} session
   */
  async sessionClose(r, session) {
    await this.t.call("DELETE", `/v1/sandboxes/${esc(ref(r))}/sessions/${esc(session)}`);
  }

  // -- checkpoints, rollback, fork -------------------------------------

  /**
   * @param {Ref} r
   * @param {import("./index.js").CheckpointOptions} [o]
   */
  checkpoint(r, o = {}) {
    const req = body({ kind: o.kind, label: o.label, wait: o.wait, keep: o.keep });
    return this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/checkpoints`, req, o.progress);
  }

  /** @param {Ref} r */
  async checkpoints(r) {
    return (await this.t.call("GET", `/v1/sandboxes/${esc(ref(r))}/checkpoints`)) ?? [];
  }

  /** @param {Ref} r */
  async checkpointTree(r) {
    return checkpointTree(await this.checkpoints(r));
  }

  /** @param {Ref} c */
  inspectCheckpoint(c) {
    return this.t.call("GET", "/v1/checkpoints/" + esc(ref(c)));
  }

  /** @param {Ref} c */
  async deleteCheckpoint(c) {
    await this.t.call("DELETE", "/v1/checkpoints/" + esc(ref(c)));
  }

  /** @param {Ref} c */
  verifyCheckpoint(c) {
    return this.t.call("POST", `/v1/checkpoints/${esc(ref(c))}/verify`);
  }

  /** @param {Ref} c */
  verifyChain(c) {
    return this.t.call("GET", `/v1/checkpoints/${esc(ref(c))}/chain`);
  }

  /**
   * @param {Ref} r
   * @param {Ref} checkpoint
   * @param {import("./index.js").RollbackOptions} [o]
   */
  async rollback(r, checkpoint, o = {}) {
    const req = body({ checkpoint: ref(checkpoint), tier: o.tier || undefined, force: o.force, dry_run: o.dryRun });
    const res = await this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/rollback`, req);
    const comp = res?.compensation;
    if (comp && comp.state !== "compensated") {
      throw new CompensationFailed(`rollback to ${res.checkpoint}: compensation ${comp.state}`, res);
    }
    return res;
  }

  /**
   * @param {Ref} r
   * @param {number} [n]
   * @param {import("./index.js").ForkOptions} [o]
   */
  fork(r, n = 1, o = {}) {
    const req = body({ n, checkpoint: o.checkpoint !== undefined ? ref(o.checkpoint) : undefined, reseed: o.reseed });
    return this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/fork`, req, o.progress);
  }

  /**
   * @param {Ref} checkpoint
   * @param {number} [n]
   * @param {{reseed?: boolean} & import("./index.js").ProgressOptions} [o]
   */
  forkCheckpoint(checkpoint, n = 1, o = {}) {
    return this.t.call("POST", `/v1/checkpoints/${esc(ref(checkpoint))}/fork`, body({ n, reseed: o.reseed }), o.progress);
  }

  /**
   * Forks as Sandbox handles (see Sandbox.fork).
   * @param {Ref} r
   * @param {number} [n]
   * @param {import("./index.js").ForkOptions} [o]
   */
  async forks(r, n = 1, o = {}) {
    return new Forks(this, await this.fork(r, n, o));
  }

  // -- turns, recovery, LLM endpoint -----------------------------------

  /**
   * @param {Ref} r
   * @param {import("./index.js").EndTurnOptions} [o]
   */
  endTurn(r, o = {}) {
    const req = body({ label: o.label, ignore: o.ignore?.length ? [...o.ignore] : undefined, dry_run: o.dryRun });
    return this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/turn`, req);
  }

  /** @param {Ref} r */
  async turns(r) {
    return (await this.t.call("GET", `/v1/sandboxes/${esc(ref(r))}/turns`)) ?? [];
  }

  /**
   * @param {Ref} r
   * @param {import("./index.js").RecoverOptions} [o]
   */
  recover(r, o = {}) {
    const req = body({ to: o.to !== undefined ? ref(o.to) : undefined, force: o.force, dry_run: o.dryRun });
    return this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/recover`, req);
  }

  /** @param {Ref} r */
  recovery(r) {
    return this.t.call("GET", `/v1/sandboxes/${esc(ref(r))}/recover`);
  }

  /**
   * @param {Ref} r
   * @param {string} upstream
   * @param {SetLLMOptions} [o]
   */
  setLLM(r, upstream, o = {}) {
    const req = body({
      upstream, listen: o.listen, expose: o.expose, gate: o.gate, header: opt(o.header),
      ignore: o.ignore?.length ? [...o.ignore] : undefined,
    });
    return this.t.call("PUT", `/v1/sandboxes/${esc(ref(r))}/llm`, req);
  }

  /** @param {Ref} r */
  llm(r) {
    return this.t.call("GET", `/v1/sandboxes/${esc(ref(r))}/llm`);
  }

  /** @param {Ref} r */
  async removeLLM(r) {
    await this.t.call("DELETE", `/v1/sandboxes/${esc(ref(r))}/llm`);
  }

  // -- effects ---------------------------------------------------------

  /**
   * @param {Ref} r
   * @param {Ref} [since]
   */
  async effects(r, since) {
    let p = `/v1/sandboxes/${esc(ref(r))}/effects`;
    if (since !== undefined) {
      p += "?since=" + esc(ref(since));
    }
    return (await this.t.call("GET", p)) ?? [];
  }

  /**
   * @param {Ref} r
   * @param {DeclareEffectOptions} [o]
   */
  declareEffect(r, o = {}) {
    const req = body({
      kind: o.kind, state: o.state, method: o.method, url: o.url, host: o.host, body: b64(o.body),
      idempotency_key: o.idempotencyKey, status: o.status, response_body: b64(o.responseBody),
      compensator: compensator(o.compensator), type: o.type,
    });
    // undefined: every earlier effect; []: none.
    req.depends_on = o.dependsOn !== undefined ? [...o.dependsOn] : null;
    return this.t.call("POST", `/v1/sandboxes/${esc(ref(r))}/effects`, req);
  }

  /**
   * @param {Ref} effect
   * @param {string} by
   * @param {string} [note]
   */
  consumeEffect(effect, by, note) {
    return this.t.call("POST", `/v1/effects/${esc(ref(effect))}/consumers`, body({ by, note }));
  }

  /**
   * @param {Ref} effect
   * @param {Compensator} c
   */
  setCompensator(effect, c) {
    return this.t.call("POST", `/v1/effects/${esc(ref(effect))}/compensator`, compensator(c));
  }

  // -- audit, tenants, tokens, keys (host admin) -----------------------

  /** @param {number} [since] */
  auditExport(since = 0) {
    return this.t.raw("GET", "/v1/audit" + (since ? `?since=${Math.trunc(since)}` : ""));
  }

  auditVerify() {
    return this.t.call("POST", "/v1/audit/verify");
  }

  /** @param {string} name */
  createTenant(name) {
    return this.t.call("POST", "/v1/tenants", { name });
  }

  async tenants() {
    return (await this.t.call("GET", "/v1/tenants")) ?? [];
  }

  /** @param {string} name */
  async deleteTenant(name) {
    await this.t.call("DELETE", "/v1/tenants/" + esc(name));
  }

  /**
   * @param {string} tenant
   * @param {import("./index.js").CreateTokenOptions} [o]
   */
  createToken(tenant, o = {}) {
    const req = body({
      tenant, scopes: o.scopes?.length ? [...o.scopes] : undefined,
      sandboxes: o.sandboxes?.length ? [...o.sandboxes] : undefined, note: o.note,
    });
    return this.t.call("POST", "/v1/tokens", req);
  }

  /** @param {string} [tenant] */
  async tokens(tenant = "") {
    return (await this.t.call("GET", "/v1/tokens?tenant=" + esc(tenant))) ?? [];
  }

  /** @param {string} id */
  async deleteToken(id) {
    await this.t.call("DELETE", "/v1/tokens/" + esc(id));
  }

  async dataKeys() {
    return (await this.t.call("GET", "/v1/keys")) ?? [];
  }

  /** @param {string} [tenant] */
  rotateDataKey(tenant = "") {
    return this.t.call("POST", "/v1/keys/rotate", { tenant });
  }

  /** @param {string} tenant */
  shredDataKeys(tenant) {
    return this.t.call("POST", "/v1/keys/shred", { tenant });
  }
}
