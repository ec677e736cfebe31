// HTTP/1.1 to the daemon, over its unix socket or a TLS endpoint.
//
// Node's own http and https modules only: a request with `socketPath` for
// the unix socket, https with the endpoint's CA for TLS, and the client's
// upgrade event for the exec stream. Each request opens its own connection
// (no agent keeps one), as the daemon's other clients do.

import * as http from "node:http";
import * as https from "node:https";
import { readFileSync } from "node:fs";

import { ConnectionFailed, Internal, MoltError, errorFromBody } from "./errors.js";

export const DEFAULT_SOCKET = "/run/molt/molt.sock";

// Bounds what is read of an error body or a JSON answer line, so a broken
// peer cannot make the client hold without limit.
const MAX_ERROR_BODY = 1 << 20;
const MAX_LINE = 4 << 20;
// A JSON answer (lists of sandboxes, checkpoints, effects) is bounded too.
const MAX_BODY = 256 << 20;

/**
 * @typedef {object} TransportOptions
 * @property {string} [socket]
 * @property {string} [endpoint]
 * @property {string} [token]
 * @property {string} [tlsCA]
 * @property {number} [timeoutMs]
 */

export class Transport {
  /** @param {TransportOptions} [opts] */
  constructor(opts = {}) {
    const env = process.env;
    /** @type {string} */
    this.endpoint = opts.endpoint ?? env.MOLT_ENDPOINT ?? "";
    /** @type {string} */
    this.token = opts.token ?? env.MOLT_TOKEN ?? "";
    /** @type {string} */
    this.tlsCA = opts.tlsCA ?? env.MOLT_TLS_CA ?? "";
    /** @type {string} */
    this.socketPath = opts.socket || env.MOLT_SOCKET || DEFAULT_SOCKET;
    /** @type {number | undefined} */
    this.timeoutMs = opts.timeoutMs;
    /** @type {string} */
    this.host = "molt";
    /** @type {number} */
    this.port = 0;
    /** @type {Buffer | undefined} */
    this.ca = undefined;
    if (this.endpoint) {
      let u;
      try {
        u = new URL(this.endpoint);
      } catch {
        u = undefined;
      }
      if (!u || u.protocol !== "https:" || !u.hostname) {
        throw new TypeError(`endpoint ${JSON.stringify(this.endpoint)}: want https://HOST:PORT`);
      }
      // URL keeps an IPv6 address in brackets; the socket wants it bare.
      this.host = u.hostname.replace(/^\[(.*)\]$/, "$1");
      this.port = u.port ? Number(u.port) : 443;
      if (this.tlsCA) {
        this.ca = readFileSync(this.tlsCA);
      }
    }
  }

  /** The daemon's address, for messages. */
  where() {
    return this.endpoint || this.socketPath;
  }

  /**
   * @param {boolean} hasBody
   * @returns {Record<string, string>}
   */
  headers(hasBody) {
    /** @type {Record<string, string>} */
    const h = { Accept: "application/json" };
    if (hasBody) {
      h["Content-Type"] = "application/json";
    }
    if (this.token) {
      h.Authorization = "Bearer " + this.token;
    }
    return h;
  }

  /**
   * @param {string} method
   * @param {string} path
   * @param {Record<string, string>} headers
   * @param {number | undefined} timeoutMs
   * @returns {http.ClientRequest}
   */
  request(method, path, headers, timeoutMs) {
    /** @type {http.RequestOptions} */
    const common = { method, path, headers, agent: false, timeout: timeoutMs };
    if (this.endpoint) {
      return https.request({
        ...common, host: this.host, port: this.port, ca: this.ca, minVersion: "TLSv1.2",
      });
    }
    return http.request({ ...common, socketPath: this.socketPath });
  }

  /**
   * @param {unknown} err
   * @returns {ConnectionFailed}
   */
  connectError(err) {
    const hint = this.endpoint ? "" : " (is `molt daemon` running?)";
    const msg = err instanceof Error ? err.message : String(err);
    return new ConnectionFailed(`connect to molt daemon at ${this.where()}${hint}: ${msg}`, { cause: err });
  }

  /**
   * Sends a request and resolves to its 2xx response (the caller reads
   * it), or rejects with the typed error.
   *
   * @param {string} method
   * @param {string} path
   * @param {unknown} [body]
   * @param {number | undefined} [timeoutMs]
   * @param {string | undefined} [accept]
   * @param {{source: import("node:stream").Readable, contentType: string} | undefined} [upload]
   *   a stream sent as the body (chunked) instead of `body` as JSON
   * @returns {Promise<http.IncomingMessage>}
   */
  open(method, path, body, timeoutMs = this.timeoutMs, accept = undefined, upload = undefined) {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers = this.headers(data !== undefined);
    if (accept !== undefined) {
      headers.Accept = accept;
    }
    if (data !== undefined) {
      headers["Content-Length"] = String(data.length);
    }
    if (upload !== undefined) {
      headers["Content-Type"] = upload.contentType;
    }
    return new Promise((resolve, reject) => {
      const req = this.request(method, path, headers, timeoutMs);
      let connected = false;
      req.on("socket", (s) => {
        s.once(this.endpoint ? "secureConnect" : "connect", () => { connected = true; });
      });
      req.on("timeout", () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
      req.on("error", (err) => {
        reject(connected ? new ConnectionFailed(`${method} ${path}: ${err.message}`, { cause: err })
          : this.connectError(err));
      });
      req.on("response", (res) => {
        const status = res.statusCode ?? 0;
        if (Math.floor(status / 100) === 2) {
          resolve(res);
          return;
        }
        readBody(res, MAX_ERROR_BODY, true).then(
          (raw) => reject(errorFromBody(status, raw, res.statusMessage ?? "")),
          () => reject(errorFromBody(status, Buffer.alloc(0), res.statusMessage ?? "")),
        );
      });
      if (upload !== undefined) {
        upload.source.on("error", (err) => req.destroy(err));
        upload.source.pipe(req);
      } else {
        req.end(data);
      }
    });
  }

  /**
   * Sends a stream as a request's body and resolves to the JSON answer;
   * with `progress`, the daemon is asked to stream it (see streamed).
   *
   * @param {string} method
   * @param {string} path
   * @param {import("node:stream").Readable} source
   * @param {string} contentType
   * @param {((p: any) => void) | undefined} [progress]
   * @returns {Promise<any>}
   */
  async upload(method, path, source, contentType, progress = undefined) {
    const accept = progress !== undefined ? "application/x-ndjson, application/json" : undefined;
    const res = await this.open(method, path, undefined, 0, accept, { source, contentType });
    if (progress !== undefined && String(res.headers["content-type"] ?? "").startsWith("application/x-ndjson")) {
      return readAnswer(res, method, path, progress);
    }
    let raw;
    try {
      raw = await readBody(res, MAX_BODY, false);
    } catch (err) {
      throw asMoltError(err, `${method} ${path}`);
    }
    const text = raw.toString("utf8");
    return text.trim() ? JSON.parse(text) : undefined;
  }

  /**
   * Sends a request and resolves to its decoded JSON answer (undefined
   * for an empty body).
   *
   * @param {string} method
   * @param {string} path
   * @param {unknown} [body]
   * @param {((p: any) => void) | undefined} [progress]
   * @returns {Promise<any>}
   */
  async call(method, path, body, progress = undefined) {
    if (progress !== undefined) {
      return this.streamed(method, path, body, progress);
    }
    const res = await this.open(method, path, body);
    let raw;
    try {
      raw = await readBody(res, MAX_BODY, false);
    } catch (err) {
      throw asMoltError(err, `${method} ${path}`);
    }
    const text = raw.toString("utf8");
    if (!text.trim()) {
      return undefined;
    }
    try {
      return JSON.parse(text);
    } catch (err) {
      throw new Internal(`${method} ${path}: decode response: ${/** @type {Error} */ (err).message}`);
    }
  }

  /**
   * Sends a request asking the daemon to stream its answer (docs/api.md,
   * "Progress"): each report goes to `progress` as it comes; resolves to
   * the answer, or rejects with the error, as without.
   *
   * @param {string} method
   * @param {string} path
   * @param {unknown} body
   * @param {(p: any) => void} progress
   * @returns {Promise<any>}
   */
  async streamed(method, path, body, progress) {
    const res = await this.open(method, path, body, 0, "application/x-ndjson, application/json");
    if (!String(res.headers["content-type"] ?? "").startsWith("application/x-ndjson")) {
      let raw;
      try {
        raw = await readBody(res, MAX_BODY, false);
      } catch (err) {
        throw asMoltError(err, `${method} ${path}`);
      }
      const text = raw.toString("utf8");
      return text.trim() ? JSON.parse(text) : undefined;
    }
    return readAnswer(res, method, path, progress);
  }

  /**
   * Sends a request and resolves to its body as bytes.
   *
   * @param {string} method
   * @param {string} path
   * @returns {Promise<Buffer>}
   */
  async raw(method, path) {
    const res = await this.open(method, path);
    try {
      return await readBody(res, MAX_BODY, false);
    } catch (err) {
      throw asMoltError(err, `${method} ${path}`);
    }
  }

  /**
   * Sends a request whose answer is NDJSON and yields each line's object
   * as it arrives.
   *
   * @param {string} method
   * @param {string} path
   * @param {unknown} [body]
   * @returns {AsyncGenerator<any, void, void>}
   */
  async *lines(method, path, body) {
    const res = await this.open(method, path, body, 0);
    let buf = Buffer.alloc(0);
    try {
      for await (const chunk of res) {
        buf = Buffer.concat([buf, chunk]);
        let nl;
        while ((nl = buf.indexOf(10)) >= 0) {
          const line = buf.subarray(0, nl);
          buf = buf.subarray(nl + 1);
          const v = decodeLine(line, method, path);
          if (v !== undefined) {
            yield v;
          }
        }
        if (buf.length > MAX_LINE) {
          throw new Internal(`${method} ${path}: a line over ${MAX_LINE} bytes`);
        }
      }
      const v = decodeLine(buf, method, path);
      if (v !== undefined) {
        yield v;
      }
    } catch (err) {
      throw asMoltError(err, `${method} ${path}`);
    } finally {
      res.destroy();
    }
  }

  /**
   * Sends a POST asking to upgrade to `protocol` and resolves to the
   * socket and the bytes that came after the 101 answer; rejects with the
   * typed error the daemon sent instead.
   *
   * @param {string} path
   * @param {unknown} body
   * @param {string} protocol
   * @returns {Promise<{socket: import("node:stream").Duplex, head: Buffer}>}
   */
  upgrade(path, body, protocol) {
    const data = Buffer.from(JSON.stringify(body));
    const headers = this.headers(true);
    headers["Content-Length"] = String(data.length);
    headers.Connection = "Upgrade";
    headers.Upgrade = protocol;
    return new Promise((resolve, reject) => {
      const req = this.request("POST", path, headers, this.timeoutMs);
      let connected = false;
      req.on("socket", (s) => {
        s.once(this.endpoint ? "secureConnect" : "connect", () => { connected = true; });
      });
      req.on("timeout", () => req.destroy(new Error(`no answer within ${this.timeoutMs} ms`)));
      req.on("error", (err) => {
        reject(connected ? new ConnectionFailed(`POST ${path}: ${err.message}`, { cause: err })
          : this.connectError(err));
      });
      req.on("upgrade", (res, socket, head) => {
        // The stream has no deadline: a command runs as long as it runs
        // (its own timeoutMs bounds it).
        socket.setTimeout(0);
        if (res.statusCode !== 101) {
          socket.destroy();
          reject(new ConnectionFailed(`POST ${path}: upgrade answered ${res.statusCode}`));
          return;
        }
        resolve({ socket, head });
      });
      req.on("response", (res) => {
        const status = res.statusCode ?? 0;
        readBody(res, MAX_ERROR_BODY, true).then(
          (raw) => reject(errorFromBody(status, raw, res.statusMessage ?? "")),
          () => reject(errorFromBody(status, Buffer.alloc(0), res.statusMessage ?? "")),
        );
      });
      req.end(data);
    });
  }
}

/**
 * @param {Buffer} line
 * @param {string} method
 * @param {string} path
 * @returns {any}
 */
function decodeLine(line, method, path) {
  if (line.length > MAX_LINE) {
    throw new Internal(`${method} ${path}: a line over ${MAX_LINE} bytes`);
  }
  const text = line.toString("utf8").trim();
  if (!text) {
    return undefined;
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Internal(`${method} ${path}: decode progress: ${/** @type {Error} */ (err).message}`);
  }
}

/**
 * Reads a streamed answer (v1.Progress lines): reports go to `progress`,
 * the last line's result is returned or its error thrown.
 *
 * @param {http.IncomingMessage} res
 * @param {string} method
 * @param {string} path
 * @param {(p: any) => void} progress
 * @returns {Promise<any>}
 */
async function readAnswer(res, method, path, progress) {
  let buf = Buffer.alloc(0);
  try {
    for await (const chunk of res) {
      buf = Buffer.concat([buf, chunk]);
      let nl;
      while ((nl = buf.indexOf(10)) >= 0) {
        const v = decodeLine(buf.subarray(0, nl), method, path);
        buf = buf.subarray(nl + 1);
        if (v === undefined) {
          continue;
        }
        if (v.error) {
          throw errorFromBody(v.status || 200, Buffer.from(JSON.stringify(v.error)));
        }
        if ("result" in v) {
          return v.result;
        }
        progress(v);
      }
      if (buf.length > MAX_LINE) {
        throw new Internal(`${method} ${path}: a line over ${MAX_LINE} bytes`);
      }
    }
  } catch (err) {
    throw asMoltError(err, `${method} ${path}`);
  } finally {
    res.destroy();
  }
  throw new ConnectionFailed(`${method} ${path}: the daemon closed the stream without an answer`);
}

/**
 * Reads a response's body, at most `limit` bytes: past it, either the
 * rest is dropped (`truncate`, for an error's message) or it is an error.
 *
 * @param {http.IncomingMessage} res
 * @param {number} limit
 * @param {boolean} truncate
 * @returns {Promise<Buffer>}
 */
async function readBody(res, limit, truncate) {
  /** @type {Buffer[]} */
  const parts = [];
  let n = 0;
  try {
    for await (const chunk of res) {
      const b = /** @type {Buffer} */ (chunk);
      if (n + b.length > limit) {
        if (truncate) {
          parts.push(b.subarray(0, limit - n));
          n = limit;
          break;
        }
        throw new Internal(`answer over ${limit} bytes`);
      }
      parts.push(b);
      n += b.length;
    }
  } finally {
    res.destroy();
  }
  return Buffer.concat(parts, n);
}

/**
 * @param {unknown} err
 * @param {string} what
 * @returns {MoltError}
 */
function asMoltError(err, what) {
  if (err instanceof MoltError) {
    return err;
  }
  const msg = err instanceof Error ? err.message : String(err);
  return new ConnectionFailed(`${what}: ${msg}`, { cause: err });
}
