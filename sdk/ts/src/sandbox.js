// A handle on one sandbox.

import { NotFound } from "./errors.js";

/** @typedef {import("./index.js").Ref} Ref */
/** @typedef {import("./index.js").SandboxInfo} SandboxInfo */
/** @typedef {import("./client.js").Client} Client */

/**
 * A sandbox of a molt daemon, and every operation on it. Made by
 * `client.createSandbox()` (alias `client.sandbox()`), `client.attach()`
 * or `Sandbox.create()`; `info` is the sandbox as last reported.
 */
export class Sandbox {
  /**
   * @param {Client} client
   * @param {SandboxInfo} info
   */
  constructor(client, info) {
    this.client = client;
    this.info = info;
    this.removed = false;
  }

  /**
   * Creates a sandbox on `client` (default: a Client from the
   * environment).
   *
   * @param {import("./index.js").CreateSandboxOptions & {client?: Client}} [o]
   * @returns {Promise<Sandbox>}
   */
  static async create(o = {}) {
    const { client, ...rest } = o;
    const c = client ?? new (await import("./client.js")).Client();
    return c.createSandbox(rest);
  }

  /** The sandbox's ID. */
  get id() {
    return this.info.id;
  }

  /** The sandbox's name, if it has one. */
  get name() {
    return this.info.name || undefined;
  }

  /** The state as last reported (refresh() reads it again). */
  get state() {
    return this.info.state ?? "";
  }

  // -- lifecycle -------------------------------------------------------

  /** Inspects the sandbox again (with its live details) and returns it. */
  async refresh() {
    this.info = await this.client.inspectSandbox(this.id);
    return this.info;
  }

  inspect() {
    return this.refresh();
  }

  /** Deletes the sandbox and its checkpoints; one already gone is not an error. */
  async remove() {
    if (this.removed) {
      return;
    }
    try {
      await this.client.removeSandbox(this.id);
    } catch (err) {
      if (!(err instanceof NotFound)) {
        throw err;
      }
    }
    this.removed = true;
  }

  /**
   * Runs `fn` with this sandbox and removes it afterwards, whether `fn`
   * returned or threw.
   *
   * @template T
   * @param {(sb: Sandbox) => Promise<T> | T} fn
   * @returns {Promise<T>}
   */
  async use(fn) {
    try {
      return await fn(this);
    } finally {
      await this.remove();
    }
  }

  async stop() {
    this.info = await this.client.stop(this.id);
    return this.info;
  }

  async start() {
    this.info = await this.client.start(this.id);
    return this.info;
  }

  /**
   * Full checkpoint, then stop: the sandbox costs no memory until resume().
   * With {offload: true}, no local disk either: its checkpoint waits in the
   * daemon's object store.
   * @param {import("./index.js").HibernateOptions} [o]
   */
  async hibernate(o) {
    this.info = await this.client.hibernate(this.id, o);
    return this.info;
  }

  /** Restores the hibernated sandbox, processes and all. */
  /** @param {import("./index.js").ProgressOptions} [o] */
  async resume(o) {
    this.info = await this.client.resume(this.id, o);
    return this.info;
  }

  // -- commands --------------------------------------------------------

  /**
   * @param {readonly string[]} args
   * @param {import("./index.js").ExecOptions} [o]
   */
  exec(args, o) {
    return this.client.exec(this.id, args, o);
  }

  /**
   * @param {readonly string[]} args
   * @param {import("./index.js").ExecStreamOptions} [o]
   */
  execStream(args, o) {
    return this.client.execStream(this.id, args, o);
  }

  /**
   * @param {readonly string[]} args
   * @param {Omit<import("./index.js").ExecStreamOptions, "stdin">} [o]
   */
  execDetached(args, o) {
    return this.client.execDetached(this.id, args, o);
  }

  /**
   * Runs shell text in a persistent session ("main" by default): cd,
   * variables and background jobs stay for the next call.
   *
   * @param {string} command
   * @param {import("./index.js").RunOptions & {session?: string}} [o]
   */
  run(command, o = {}) {
    const { session = "main", ...rest } = o;
    return this.client.sessionRun(this.id, session, command, rest);
  }

  /** @param {string} [session] */
  closeSession(session = "main") {
    return this.client.sessionClose(this.id, session);
  }

  // -- checkpoints -----------------------------------------------------

  /**
   * @param {string} [label]
   * @param {Omit<import("./index.js").CheckpointOptions, "label">} [o]
   */
  checkpoint(label, o = {}) {
    return this.client.checkpoint(this.id, { ...o, label });
  }

  /** @param {string} name */
  commit(name) {
    return this.client.commit(this.id, name);
  }

  checkpoints() {
    return this.client.checkpoints(this.id);
  }

  checkpointTree() {
    return this.client.checkpointTree(this.id);
  }

  /**
   * @param {Ref} checkpoint
   * @param {import("./index.js").RollbackOptions} [o]
   */
  rollback(checkpoint, o) {
    return this.client.rollback(this.id, checkpoint, o);
  }

  /**
   * Makes `n` copies of the sandbox (from `checkpoint`, or a new fs
   * checkpoint) and returns them as Forks.
   *
   * @param {number} [n]
   * @param {import("./index.js").ForkOptions} [o]
   */
  fork(n = 1, o) {
    return this.client.forks(this.id, n, o);
  }

  // -- turns, recovery, LLM, effects -----------------------------------

  /** @param {import("./index.js").EndTurnOptions} [o] */
  endTurn(o) {
    return this.client.endTurn(this.id, o);
  }

  turns() {
    return this.client.turns(this.id);
  }

  /** @param {import("./index.js").RecoverOptions} [o] */
  recover(o) {
    return this.client.recover(this.id, o);
  }

  recovery() {
    return this.client.recovery(this.id);
  }

  /**
   * @param {string} upstream
   * @param {import("./index.js").SetLLMOptions} [o]
   */
  setLLM(upstream, o) {
    return this.client.setLLM(this.id, upstream, o);
  }

  llm() {
    return this.client.llm(this.id);
  }

  removeLLM() {
    return this.client.removeLLM(this.id);
  }

  /** @param {Ref} [since] */
  effects(since) {
    return this.client.effects(this.id, since);
  }

  /** @param {import("./index.js").DeclareEffectOptions} [o] */
  declareEffect(o) {
    return this.client.declareEffect(this.id, o);
  }
}

/**
 * The sandboxes a fork made (Sandbox handles, iterable), with the fork's
 * `result` (checkpoint, duration_ms, forks_per_second).
 */
export class Forks {
  /**
   * @param {Client} client
   * @param {import("./index.js").ForkResult} result
   */
  constructor(client, result) {
    this.result = result;
    this.sandboxes = (result.sandboxes ?? []).map((info) => new Sandbox(client, info));
  }

  /** The checkpoint the forks started from. */
  get checkpoint() {
    return this.result.checkpoint;
  }

  get length() {
    return this.sandboxes.length;
  }

  [Symbol.iterator]() {
    return this.sandboxes[Symbol.iterator]();
  }

  /** Removes every fork. */
  async remove() {
    for (const sb of this.sandboxes) {
      await sb.remove();
    }
  }

  /**
   * Runs `fn` with the forks and removes them afterwards.
   *
   * @template T
   * @param {(forks: Forks) => Promise<T> | T} fn
   * @returns {Promise<T>}
   */
  async use(fn) {
    try {
      return await fn(this);
    } finally {
      await this.remove();
    }
  }
}
