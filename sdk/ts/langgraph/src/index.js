// A LangGraph.js checkpoint saver that keeps each thread's molt sandbox in
// step with the graph: every graph checkpoint of a thread is stored
// together with a molt checkpoint of the thread's sandbox taken at the
// same step, so that resuming from an earlier checkpoint_id (time travel)
// rolls the sandbox back to that step, and forking a thread forks the
// sandbox from it.
//
// The graph's own checkpoints are kept by an inner saver (MemorySaver by
// default, any BaseCheckpointSaver); the molt checkpoint's ID rides in
// each checkpoint's metadata (`molt: {sandbox, checkpoint}`).

import { BaseCheckpointSaver, MemorySaver } from "@langchain/langgraph";
import { NotFound } from "@molt-sh/molt";

/** @typedef {import("@langchain/core/runnables").RunnableConfig} RunnableConfig */
/** @typedef {import("@langchain/langgraph").Checkpoint} Checkpoint */
/** @typedef {import("@langchain/langgraph").CheckpointMetadata} CheckpointMetadata */
/** @typedef {import("@langchain/langgraph").CheckpointTuple} CheckpointTuple */
/** @typedef {import("@langchain/langgraph-checkpoint").ChannelVersions} ChannelVersions */
/** @typedef {import("@langchain/langgraph-checkpoint").PendingWrite} PendingWrite */
/** @typedef {import("@langchain/langgraph-checkpoint").CheckpointListOptions} CheckpointListOptions */
/** @typedef {import("@molt-sh/molt").Sandbox} Sandbox */
/** @typedef {import("@molt-sh/molt").Client} Client */

/**
 * @typedef {object} ThreadState
 * @property {Sandbox | undefined} sandbox
 * @property {string} position the graph checkpoint the sandbox is at
 * @property {Promise<unknown>} chain sandbox operations of the thread, in order
 * @property {Set<() => void>} waiters tools waiting for the sandbox to reach a checkpoint
 */

/**
 * @param {RunnableConfig} config
 * @returns {string}
 */
function threadOf(config) {
  const t = config.configurable?.thread_id;
  if (typeof t !== "string" || !t) {
    throw new TypeError("molt saver: the config has no configurable.thread_id");
  }
  return t;
}

/** @param {RunnableConfig} config */
const rootNamespace = (config) => (config.configurable?.checkpoint_ns ?? "") === "";

export class MoltSaver extends BaseCheckpointSaver {
  /**
   * @param {object} opts
   * @param {Client} opts.client the molt daemon
   * @param {import("@molt-sh/molt").CreateSandboxOptions} [opts.sandbox] how a thread's sandbox is made
   * @param {"full" | "fs"} [opts.kind] full (files, processes, memory; the default) or fs (files)
   * @param {BaseCheckpointSaver} [opts.inner] where the graph's checkpoints are kept (default a MemorySaver)
   * @param {number} [opts.waitMs] how long a tool waits for its step's checkpoint (default 10 min)
   */
  constructor(opts) {
    super();
    this.client = opts.client;
    this.create = opts.sandbox ?? {};
    this.kind = opts.kind ?? "full";
    this.inner = opts.inner ?? new MemorySaver();
    this.waitMs = opts.waitMs ?? 600000;
    /** @type {Map<string, ThreadState>} */
    this.threads = new Map();
  }

  /**
   * @param {string} thread
   * @returns {ThreadState}
   */
  state(thread) {
    let st = this.threads.get(thread);
    if (st === undefined) {
      st = { sandbox: undefined, position: "", chain: Promise.resolve(), waiters: new Set() };
      this.threads.set(thread, st);
    }
    return st;
  }

  /**
   * Runs `fn` after the thread's earlier sandbox operations.
   *
   * @template T
   * @param {ThreadState} st
   * @param {() => Promise<T>} fn
   * @returns {Promise<T>}
   */
  serial(st, fn) {
    const run = st.chain.then(fn, fn);
    st.chain = run.catch(() => undefined);
    return run;
  }

  /**
   * @param {ThreadState} st
   * @param {string} position
   */
  moved(st, position) {
    st.position = position;
    for (const w of [...st.waiters]) {
      w();
    }
  }

  /**
   * The thread's sandbox, made on first use.
   *
   * @param {string} thread
   * @param {string} [id] an existing sandbox to attach (from a checkpoint's metadata)
   * @returns {Promise<Sandbox>}
   */
  async sandboxOf(thread, id) {
    const st = this.state(thread);
    if (st.sandbox === undefined) {
      st.sandbox = id ? await this.client.attach(id) : await this.client.sandbox(this.create);
    }
    return st.sandbox;
  }

  /**
   * The sandbox of the thread a task runs in, once it is at the step the
   * task starts from: a tool node calls this with the config LangGraph
   * gives it, and runs its commands there.
   *
   * @param {RunnableConfig} config
   * @returns {Promise<Sandbox>}
   */
  async sandbox(config) {
    const thread = threadOf(config);
    const st = this.state(thread);
    /** @type {Record<string, string> | undefined} */
    const map = config.configurable?.checkpoint_map;
    const want = map?.[""];
    if (want) {
      // The graph writes its checkpoints without waiting for them; the
      // task's step is in the sandbox once that checkpoint is stored.
      await new Promise((resolve, reject) => {
        if (st.position === want) {
          resolve(undefined);
          return;
        }
        const timer = setTimeout(() => {
          st.waiters.delete(check);
          reject(new Error(`molt saver: thread ${thread}: checkpoint ${want} not stored within ${this.waitMs} ms`));
        }, this.waitMs);
        const check = () => {
          if (st.position === want) {
            clearTimeout(timer);
            st.waiters.delete(check);
            resolve(undefined);
          }
        };
        st.waiters.add(check);
      });
    }
    await st.chain;
    return this.sandboxOf(thread);
  }

  /**
   * Loads a graph checkpoint; the thread's sandbox is rolled back to the
   * step it was taken at when it is somewhere else (time travel: a run
   * from an earlier checkpoint_id, or continuing at the head after one).
   *
   * @param {RunnableConfig} config
   * @returns {Promise<CheckpointTuple | undefined>}
   */
  async getTuple(config) {
    const tuple = await this.inner.getTuple(config);
    if (tuple === undefined || !rootNamespace(config)) {
      return tuple;
    }
    const thread = threadOf(config);
    /** @type {{sandbox?: string, checkpoint?: string} | undefined} */
    const molt = /** @type {any} */ (tuple.metadata)?.molt;
    const id = tuple.config.configurable?.checkpoint_id;
    if (!molt?.checkpoint || !id) {
      return tuple;
    }
    const st = this.state(thread);
    await this.serial(st, async () => {
      if (st.position === id) {
        return;
      }
      const sb = await this.sandboxOf(thread, molt.sandbox);
      await sb.rollback(molt.checkpoint);
      this.moved(st, id);
    });
    return tuple;
  }

  /**
   * @param {RunnableConfig} config
   * @param {CheckpointListOptions} [options]
   * @returns {AsyncGenerator<CheckpointTuple>}
   */
  list(config, options) {
    return this.inner.list(config, options);
  }

  /**
   * Stores a graph checkpoint with a molt checkpoint of the thread's
   * sandbox as it is now.
   *
   * @param {RunnableConfig} config
   * @param {Checkpoint} checkpoint
   * @param {CheckpointMetadata} metadata
   * @param {ChannelVersions} newVersions
   * @returns {Promise<RunnableConfig>}
   */
  async put(config, checkpoint, metadata, newVersions) {
    if (!rootNamespace(config)) {
      return this.inner.put(config, checkpoint, metadata, newVersions);
    }
    const thread = threadOf(config);
    const st = this.state(thread);
    return this.serial(st, async () => {
      const sb = await this.sandboxOf(thread);
      const ck = await sb.checkpoint(`lg-${checkpoint.id}`, { kind: this.kind, wait: true });
      const meta = { ...metadata, molt: { sandbox: sb.id, checkpoint: ck.id } };
      const out = await this.inner.put(config, checkpoint, meta, newVersions);
      this.moved(st, checkpoint.id);
      return out;
    });
  }

  /**
   * @param {RunnableConfig} config
   * @param {PendingWrite[]} writes
   * @param {string} taskId
   */
  putWrites(config, writes, taskId) {
    return this.inner.putWrites(config, writes, taskId);
  }

  /**
   * Deletes a thread's checkpoints and removes its sandbox.
   * @param {string} threadId
   */
  async deleteThread(threadId) {
    const st = this.threads.get(threadId);
    this.threads.delete(threadId);
    await this.inner.deleteThread(threadId);
    try {
      await st?.sandbox?.remove();
    } catch (err) {
      if (!(err instanceof NotFound)) {
        throw err;
      }
    }
  }

  /**
   * Forks a thread at a checkpoint into a new thread: the new thread
   * starts from that graph checkpoint with a sandbox forked from the molt
   * checkpoint taken with it (files, and with full checkpoints processes
   * and memory). Resolves to the new thread's config.
   *
   * @param {RunnableConfig} from a thread_id, and the checkpoint_id to fork at (default its latest)
   * @param {string} threadId the new thread
   * @returns {Promise<RunnableConfig>}
   */
  async forkThread(from, threadId) {
    const tuple = await this.inner.getTuple(from);
    /** @type {{sandbox?: string, checkpoint?: string} | undefined} */
    const molt = /** @type {any} */ (tuple?.metadata)?.molt;
    if (tuple === undefined || !molt?.checkpoint) {
      throw new Error(`molt saver: thread ${threadOf(from)} has no such checkpoint with a sandbox checkpoint`);
    }
    if (this.threads.get(threadId)?.sandbox !== undefined || (await this.inner.getTuple({ configurable: { thread_id: threadId } }))) {
      throw new Error(`molt saver: thread ${threadId} already exists`);
    }
    const res = await this.client.forkCheckpoint(molt.checkpoint, 1);
    const info = res.sandboxes[0];
    const st = this.state(threadId);
    st.sandbox = await this.client.attach(info.id);
    // The fork's own checkpoint of that step, for its time travel.
    const ck = await st.sandbox.checkpoint(`lg-${tuple.checkpoint.id}`, { kind: this.kind, wait: true });
    const meta = { ...tuple.metadata, molt: { sandbox: info.id, checkpoint: ck.id } };
    const out = await this.inner.put({ configurable: { thread_id: threadId, checkpoint_ns: "" } },
      tuple.checkpoint, /** @type {CheckpointMetadata} */ (meta), {});
    this.moved(st, tuple.checkpoint.id);
    return out;
  }
}
