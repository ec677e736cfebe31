// The exec stream (docs/api.md, "Exec stream").
//
// After `101 Switching Protocols` both directions carry frames: one type
// byte, a big-endian uint32 payload length (at most 4 MiB), the payload.

import { CommandFailed, StreamError } from "./errors.js";

export const UPGRADE_PROTOCOL = "molt-exec/1";
export const MAX_FRAME = 4 << 20;

export const FRAME_STDIN = "i";
export const FRAME_STDIN_CLOSE = "I";
export const FRAME_SIGNAL = "s";
export const FRAME_STARTED = "p";
export const FRAME_STDOUT = "o";
export const FRAME_STDERR = "e";
export const FRAME_EXIT = "x";
export const FRAME_ERROR = "E";

// What one stdin frame carries at most.
const CHUNK = 64 << 10;

/**
 * Returns one frame: `type` (one ASCII character), the length, the payload.
 *
 * @param {string} type
 * @param {Uint8Array | string} [payload]
 * @returns {Buffer}
 */
export function encodeFrame(type, payload = Buffer.alloc(0)) {
  if (type.length !== 1 || type.charCodeAt(0) > 0x7f) {
    throw new TypeError("a frame type is one ASCII byte");
  }
  const p = typeof payload === "string" ? Buffer.from(payload) : payload;
  if (p.length > MAX_FRAME) {
    throw new RangeError(`frame of ${p.length} bytes exceeds limit ${MAX_FRAME}`);
  }
  const hdr = Buffer.alloc(5);
  hdr.write(type, 0, "latin1");
  hdr.writeUInt32BE(p.length, 1);
  return Buffer.concat([hdr, p]);
}

/**
 * Reads frames from a byte stream (an async iterable of chunks, e.g. a
 * socket) that may split or join them anywhere. A frame's buffer is made
 * once its bytes are there, never from the length its header claims.
 */
export class FrameReader {
  /**
   * @param {AsyncIterable<Uint8Array>} source
   * @param {Uint8Array} [head] bytes already read from the stream
   */
  constructor(source, head) {
    /** @type {AsyncIterator<Uint8Array>} */
    this.it = source[Symbol.asyncIterator]();
    /** @type {Buffer[]} */
    this.bufs = head && head.length ? [Buffer.from(head)] : [];
    this.have = this.bufs.length ? this.bufs[0].length : 0;
  }

  /**
   * Reads more of the stream; false at its end.
   * @returns {Promise<boolean>}
   */
  async fill() {
    const r = await this.it.next();
    if (r.done) {
      return false;
    }
    const b = Buffer.from(r.value);
    this.bufs.push(b);
    this.have += b.length;
    return true;
  }

  /**
   * @param {number} n
   * @returns {Buffer}
   */
  take(n) {
    const all = this.bufs.length === 1 ? this.bufs[0] : Buffer.concat(this.bufs, this.have);
    const out = all.subarray(0, n);
    const rest = all.subarray(n);
    this.bufs = rest.length ? [rest] : [];
    this.have = rest.length;
    return out;
  }

  /**
   * Resolves to the next frame, or undefined at a clean end before one.
   * Rejects with StreamError for a truncated or oversized frame.
   *
   * @returns {Promise<{type: string, payload: Buffer} | undefined>}
   */
  async next() {
    while (this.have < 5) {
      if (!(await this.fill())) {
        if (this.have === 0) {
          return undefined;
        }
        throw new StreamError("exec stream: truncated frame header");
      }
    }
    const hdr = this.take(5);
    const n = hdr.readUInt32BE(1);
    if (n > MAX_FRAME) {
      throw new StreamError(`exec stream: frame of ${n} bytes exceeds limit ${MAX_FRAME}`);
    }
    while (this.have < n) {
      if (!(await this.fill())) {
        throw new StreamError("exec stream: truncated frame");
      }
    }
    return { type: hdr.toString("latin1", 0, 1), payload: Buffer.from(this.take(n)) };
  }
}

/** A piece of a command's output, as it came. */
export class OutputChunk {
  /**
   * @param {"stdout" | "stderr"} stream
   * @param {Buffer} data
   */
  constructor(stream, data) {
    this.stream = stream;
    this.data = data;
  }

  /** The bytes decoded as UTF-8 (invalid bytes replaced). */
  get text() {
    return this.data.toString("utf8");
  }
}

/** How a command ended. */
export class ExecResult {
  /** @param {Partial<import("./index.js").ExecResult>} init */
  constructor(init) {
    /** Its exit status: 128+N when killed by signal N, 124 at its timeout, 127 when not found. */
    this.exit_code = init.exit_code ?? 0;
    /** The signal that killed it, if one did. */
    this.signal = init.signal ?? "";
    this.timed_out = init.timed_out ?? false;
    this.duration_ms = init.duration_ms ?? 0;
    /** A recovery's fast-forward answered from the turn log. */
    this.replayed = init.replayed ?? false;
    /** @type {Buffer} */
    this.stdout = init.stdout ?? Buffer.alloc(0);
    /** @type {Buffer} */
    this.stderr = init.stderr ?? Buffer.alloc(0);
    /** @type {number | undefined} */
    this.pid = init.pid;
    /** @type {string[]} */
    this.args = init.args ?? [];
  }

  /** Whether the command exited 0. */
  get ok() {
    return this.exit_code === 0;
  }

  get stdoutText() {
    return this.stdout.toString("utf8");
  }

  get stderrText() {
    return this.stderr.toString("utf8");
  }

  /**
   * Returns this if the command exited 0, else throws CommandFailed.
   * @returns {ExecResult}
   */
  check() {
    if (this.exit_code !== 0) {
      const sig = this.signal ? ` (${this.signal})` : "";
      const err = this.stderr.length ? ": " + this.stderrText.trim().slice(-500) : "";
      throw new CommandFailed(`command ${JSON.stringify(this.args)} exited ${this.exit_code}${sig}${err}`, this);
    }
    return this;
  }
}

/**
 * @typedef {undefined | boolean | string | Uint8Array | AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>} Stdin
 */

/**
 * A running command: iterate it (`for await`) for its output, then read
 * `result`. With `stdin: true` the caller writes the command's input with
 * write() and ends it with closeStdin(); signal() sends a signal to the
 * command's process group. Closing the stream before the command ends
 * kills it.
 */
export class ExecStream {
  /**
   * @param {import("node:stream").Duplex} socket
   * @param {Buffer} head
   * @param {string[]} args
   * @param {Stdin} stdin
   */
  constructor(socket, head, args, stdin) {
    this.socket = socket;
    this.reader = new FrameReader(socket, head);
    this.args = [...args];
    this.closed = false;
    this.iterating = false;
    /** @type {number | undefined} The command's PID inside the sandbox, once the daemon sent it. */
    this.pid = undefined;
    /** @type {ExecResult | undefined} The exit status, once the command ended. */
    this.result = undefined;
    // A write to a socket the daemon closed fails there; the command's
    // status (or the read's error) says how it ended.
    socket.on("error", () => {});
    if (stdin !== undefined && typeof stdin !== "boolean") {
      this.feeding = this.feed(stdin);
    }
  }

  /**
   * @param {string} type
   * @param {Uint8Array | string} [payload]
   * @returns {Promise<void>}
   */
  send(type, payload) {
    const frame = encodeFrame(type, payload);
    return new Promise((resolve, reject) => {
      if (this.closed || this.socket.destroyed) {
        reject(new StreamError("exec stream: closed"));
        return;
      }
      this.socket.write(frame, (err) => (err ? reject(new StreamError(`exec stream: ${err.message}`)) : resolve()));
    });
  }

  /**
   * @param {Exclude<Stdin, undefined | boolean>} src
   * @returns {Promise<void>}
   */
  async feed(src) {
    try {
      if (typeof src === "string" || src instanceof Uint8Array) {
        await this.write(src);
      } else {
        for await (const b of src) {
          await this.write(b);
        }
      }
      await this.closeStdin();
    } catch {
      // The command ended or the stream closed; its status says how.
    }
  }

  /**
   * Sends `data` to the command's stdin (needs `stdin: true`).
   * @param {Uint8Array | string} data
   * @returns {Promise<void>}
   */
  async write(data) {
    const b = typeof data === "string" ? Buffer.from(data) : data;
    for (let off = 0; off < b.length; off += CHUNK) {
      await this.send(FRAME_STDIN, b.subarray(off, off + CHUNK));
    }
  }

  /** Ends the command's stdin (it reads EOF). */
  closeStdin() {
    return this.send(FRAME_STDIN_CLOSE);
  }

  /**
   * Sends signal `signum` to the command's process group.
   * @param {number} signum
   */
  signal(signum) {
    if (!Number.isInteger(signum) || signum <= 0) {
      throw new RangeError(`signal ${signum}: want a positive signal number`);
    }
    return this.send(FRAME_SIGNAL, String(signum));
  }

  /** @returns {AsyncGenerator<OutputChunk, void, void>} */
  async *[Symbol.asyncIterator]() {
    if (this.iterating) {
      throw new StreamError("exec stream: already being read");
    }
    this.iterating = true;
    try {
      while (this.result === undefined) {
        if (this.closed) {
          throw new StreamError("exec stream: closed before the command's exit status");
        }
        let f;
        try {
          f = await this.reader.next();
        } catch (err) {
          this.close();
          if (err instanceof StreamError) {
            throw err;
          }
          throw new StreamError(`exec stream: ${/** @type {Error} */ (err).message}`, { cause: err });
        }
        if (f === undefined) {
          this.close();
          throw new StreamError("exec stream: ended before the command's exit status");
        }
        const chunk = this.handle(f.type, f.payload);
        if (chunk !== undefined) {
          yield chunk;
        }
      }
    } finally {
      this.iterating = false;
    }
  }

  /**
   * @param {string} type
   * @param {Buffer} payload
   * @returns {OutputChunk | undefined}
   */
  handle(type, payload) {
    switch (type) {
      case FRAME_STDOUT:
        return new OutputChunk("stdout", payload);
      case FRAME_STDERR:
        return new OutputChunk("stderr", payload);
      case FRAME_STARTED: {
        const pid = Number(payload.toString("latin1"));
        if (Number.isSafeInteger(pid) && pid > 0) {
          this.pid = pid;
        }
        return undefined;
      }
      case FRAME_EXIT: {
        this.close();
        /** @type {any} */
        let st;
        try {
          st = JSON.parse(payload.toString("utf8"));
        } catch (err) {
          throw new StreamError(`exec: decode exit status: ${/** @type {Error} */ (err).message}`);
        }
        if (st === null || typeof st !== "object") {
          throw new StreamError("exec: the exit status is not an object");
        }
        this.result = new ExecResult({
          exit_code: Number(st.exit_code ?? 0), signal: typeof st.signal === "string" ? st.signal : "",
          timed_out: Boolean(st.timed_out), duration_ms: Number(st.duration_ms ?? 0),
          replayed: Boolean(st.replayed), pid: this.pid, args: this.args,
        });
        return undefined;
      }
      case FRAME_ERROR:
        this.close();
        throw new StreamError("exec: " + payload.toString("utf8"));
      default:
        // Other frame types are newer than this client: skipped.
        return undefined;
    }
  }

  /**
   * Reads the stream to its end and resolves to the result, its stdout
   * and stderr collected (each chunk also given to `onOutput`).
   *
   * @param {(chunk: OutputChunk) => unknown} [onOutput]
   * @returns {Promise<ExecResult>}
   */
  async wait(onOutput) {
    /** @type {Buffer[]} */
    const out = [];
    /** @type {Buffer[]} */
    const err = [];
    for await (const chunk of this) {
      (chunk.stream === "stdout" ? out : err).push(chunk.data);
      if (onOutput) {
        await onOutput(chunk);
      }
    }
    const res = /** @type {ExecResult} */ (this.result);
    res.stdout = Buffer.concat(out);
    res.stderr = Buffer.concat(err);
    return res;
  }

  /** Closes the stream; a command still running is killed. */
  close() {
    if (this.closed) {
      return;
    }
    this.closed = true;
    this.socket.destroy();
  }
}
