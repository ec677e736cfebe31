// Types of @molt-sh/langgraph (src/index.js; `tsc -p sdk/ts/langgraph`
// checks the JavaScript against its JSDoc and these declarations).

import type { RunnableConfig } from "@langchain/core/runnables";
import {
  BaseCheckpointSaver,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointTuple,
  type PendingWrite,
} from "@langchain/langgraph-checkpoint";
import type { ChannelVersions } from "@langchain/langgraph-checkpoint";
import type { Client, CreateSandboxOptions, Sandbox } from "@molt-sh/molt";

export interface MoltSaverOptions {
  /** The molt daemon. */
  client: Client;
  /** How a thread's sandbox is made (on the thread's first checkpoint). */
  sandbox?: CreateSandboxOptions;
  /** full (files, processes, memory; the default) or fs (files only). */
  kind?: "full" | "fs";
  /** Where the graph's checkpoints are kept (default a MemorySaver). */
  inner?: BaseCheckpointSaver;
  /** How long a tool waits for its step's checkpoint to be stored (default 10 min). */
  waitMs?: number;
}

/**
 * A checkpoint saver that stores each graph checkpoint of a thread with a
 * molt checkpoint of the thread's sandbox taken at the same step. Loading
 * a checkpoint (a run from a checkpoint_id, getState of one, or the head
 * after one) rolls the sandbox back to its step; forkThread forks it.
 */
export class MoltSaver extends BaseCheckpointSaver {
  constructor(opts: MoltSaverOptions);
  readonly client: Client;
  readonly inner: BaseCheckpointSaver;
  /** The thread's sandbox once it is at the step the task (its config) starts from; for tool nodes. */
  sandbox(config: RunnableConfig): Promise<Sandbox>;
  /** A new thread from a thread's checkpoint (default its latest), with a sandbox forked at that step. */
  forkThread(from: RunnableConfig, threadId: string): Promise<RunnableConfig>;
  getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined>;
  list(config: RunnableConfig, options?: CheckpointListOptions): AsyncGenerator<CheckpointTuple>;
  put(config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata, newVersions: ChannelVersions): Promise<RunnableConfig>;
  putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string): Promise<void>;
  /** Deletes the thread's checkpoints and removes its sandbox. */
  deleteThread(threadId: string): Promise<void>;
}
