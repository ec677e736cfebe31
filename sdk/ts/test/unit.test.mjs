// Tests that need no daemon: the exec framing, the error kinds, the
// checkpoint tree, the transport's options, the declared surface, and the
// client against a scripted server on a unix socket (the live tests run
// the real daemon). `node --test sdk/ts/test/unit.test.mjs`.

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { after, before, describe, test } from "node:test";

import * as molt from "@molt-sh/molt";

/** @param {Buffer[]} chunks */
const source = (chunks) => Readable.from(chunks, { objectMode: true });

describe("framing", () => {
  test("round trip, split anywhere", async () => {
    const all = Buffer.concat([
      molt.encodeFrame("o", "hello"), molt.encodeFrame("x", '{"exit_code":0}'), molt.encodeFrame("e"),
    ]);
    // One byte at a time, then all at once: the same frames.
    for (const chunks of [[...all].map((b) => Buffer.from([b])), [all]]) {
      const r = new molt.FrameReader(source(chunks));
      const got = [];
      for (let f = await r.next(); f !== undefined; f = await r.next()) {
        got.push([f.type, f.payload.toString()]);
      }
      assert.deepEqual(got, [["o", "hello"], ["x", '{"exit_code":0}'], ["e", ""]]);
    }
  });

  test("oversized length refused before reading", async () => {
    const hdr = Buffer.from([0x6f, 0, 0, 0, 0]);
    hdr.writeUInt32BE(molt.MAX_FRAME + 1, 1);
    const r = new molt.FrameReader(source([hdr]));
    await assert.rejects(r.next(), molt.StreamError);
  });

  test("truncated", async () => {
    await assert.rejects(new molt.FrameReader(source([Buffer.from("o\0")])).next(), /truncated frame header/);
    const cut = molt.encodeFrame("o", "hello").subarray(0, 7);
    await assert.rejects(new molt.FrameReader(source([cut])).next(), /truncated frame/);
    assert.equal(await new molt.FrameReader(source([])).next(), undefined);
  });

  test("encode refuses what the protocol cannot carry", () => {
    assert.throws(() => molt.encodeFrame("o", Buffer.alloc(molt.MAX_FRAME + 1)), RangeError);
    assert.throws(() => molt.encodeFrame("oo"), TypeError);
    assert.deepEqual([...molt.encodeFrame("I")], [0x49, 0, 0, 0, 0]);
  });
});

describe("errors", () => {
  test("kinds", () => {
    const cases = {
      not_found: molt.NotFound, already_exists: molt.AlreadyExists, invalid_argument: molt.InvalidArgument,
      method_not_allowed: molt.MethodNotAllowed, failed_precondition: molt.FailedPrecondition,
      unavailable: molt.Unavailable, not_supported: molt.NotSupported,
      resource_exhausted: molt.ResourceExhausted, conflict: molt.Conflict,
      unauthenticated: molt.Unauthenticated, permission_denied: molt.PermissionDenied, internal: molt.Internal,
    };
    for (const [kind, cls] of Object.entries(cases)) {
      const e = molt.errorFromBody(400, JSON.stringify({ kind, message: "m" }));
      assert.ok(e instanceof cls, kind);
      assert.ok(e instanceof molt.MoltError);
      assert.equal(e.kind, kind);
      assert.equal(e.status, 400);
      assert.equal(e.message, "m");
    }
    assert.ok(molt.errorFromBody(405, '{"kind":"method_not_allowed","message":"x"}') instanceof molt.InvalidArgument);
  });

  test("candidates and an unknown kind", () => {
    const e = molt.errorFromBody(409, '{"kind":"ambiguous_x","message":"two","candidates":["a","b"]}');
    assert.equal(e.constructor, molt.MoltError);
    assert.equal(e.kind, "ambiguous_x");
    assert.deepEqual(e.candidates, ["a", "b"]);
  });

  test("not an error body", () => {
    const e = molt.errorFromBody(502, "<html>bad gateway</html>", "Bad Gateway");
    assert.ok(e instanceof molt.Internal);
    assert.match(e.message, /502 Bad Gateway: <html>/);
    assert.ok(molt.errorFromBody(500, '{"kind":"x"}') instanceof molt.Internal);
  });

  test("CommandFailed from check()", () => {
    const r = new molt.ExecResult({ exit_code: 2, stderr: Buffer.from("boom\n"), args: ["false"] });
    assert.equal(r.ok, false);
    assert.throws(() => r.check(), (e) => e instanceof molt.CommandFailed && e.result === r && /boom/.test(e.message));
    const ok = new molt.ExecResult({ exit_code: 0 });
    assert.equal(ok.check(), ok);
  });
});

test("checkpoint tree", () => {
  const cks = [{ id: "a" }, { id: "b", parent: "a" }, { id: "c", parent: "a" }, { id: "d", parent: "gone" }];
  const roots = molt.checkpointTree(/** @type {any} */ (cks));
  assert.deepEqual(roots.map((c) => c.id), ["a", "d"]);
  assert.deepEqual(roots[0].children?.map((c) => c.id), ["b", "c"]);
});

describe("transport", () => {
  test("an unreachable socket is ConnectionFailed", async () => {
    const c = new molt.Client({ socket: "/nonexistent/molt.sock" });
    await assert.rejects(c.host(), (e) => e instanceof molt.ConnectionFailed && /molt daemon/.test(e.message));
  });

  test("the endpoint must be https", () => {
    assert.throws(() => new molt.Client({ endpoint: "http://127.0.0.1:1" }), TypeError);
  });

  test("environment", () => {
    const saved = { ...process.env };
    try {
      process.env.MOLT_SOCKET = "/x/y.sock";
      delete process.env.MOLT_ENDPOINT;
      assert.equal(new molt.Client().address, "/x/y.sock");
      assert.equal(new molt.Client("/a.sock").address, "/a.sock");
    } finally {
      process.env = saved;
    }
  });
});

// Every method the declarations promise is there (src/index.d.ts is
// written by hand; this keeps it and the code from drifting apart).
test("index.d.ts matches the classes", () => {
  const dts = readFileSync(new URL("../src/index.d.ts", import.meta.url), "utf8");
  for (const [name, cls] of [["Client", molt.Client], ["Sandbox", molt.Sandbox], ["ExecStream", molt.ExecStream],
    ["Forks", molt.Forks], ["ExecResult", molt.ExecResult]]) {
    const m = new RegExp(`export class ${name} [^{]*\\{([\\s\\S]*?)\\n\\}`).exec(dts);
    assert.ok(m, name);
    const declared = new Set([...m[1].matchAll(/^ {2}(?:readonly |static )?([a-zA-Z_]+)[<(?:]/gm)].map((x) => x[1]));
    assert.ok(declared.size > 3, name);
    for (const member of declared) {
      if (member === "constructor") {
        continue;
      }
      const own = member === "create" ? cls : cls.prototype;
      const hasIt = member in own || ["info", "client", "pid", "result", "sandboxes", "stdout", "stderr", "exit_code",
        "signal", "timed_out", "duration_ms", "replayed", "args"].includes(member);
      assert.ok(hasIt, `${name}.${member} is declared but not implemented`);
    }
    for (const member of Object.getOwnPropertyNames(cls.prototype)) {
      if (member !== "constructor" && !declared.has(member)) {
        // Internal helpers are not part of the surface.
        assert.ok(["lifecycle", "imageStream", "send", "feed", "handle"].includes(member), `${name}.${member} is not declared`);
      }
    }
  }
});

describe("against a scripted daemon", () => {
  /** @type {http.Server} */
  let server;
  let dir = "";
  /** @type {molt.Client} */
  let client;
  /** @type {{method?: string, url?: string, headers: http.IncomingHttpHeaders, body: string}[]} */
  const seen = [];

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "molt-ts-unit-"));
    const path = join(dir, "s.sock");
    server = http.createServer(async (req, res) => {
      let body = "";
      for await (const c of req) body += c;
      seen.push({ method: req.method, url: req.url, headers: req.headers, body });
      const answer = (/** @type {number} */ status, /** @type {unknown} */ obj) => {
        res.writeHead(status, { "Content-Type": "application/json" });
        res.end(typeof obj === "string" ? obj : JSON.stringify(obj));
      };
      if (req.url === "/v1/host") return answer(200, { version: "v", pool: { loop: true } });
      if (req.url === "/v1/sandboxes/sb1/hibernate?offload=true" || req.url === "/v1/sandboxes/sb1/offload") {
        return answer(200, { id: "sb1", state: "hibernated", offloaded: true });
      }
      if (req.url?.startsWith("/v1/sandboxes/missing")) {
        return answer(404, { kind: "not_found", message: "sandbox missing: not found" });
      }
      if (req.url === "/v1/images/build") {
        res.writeHead(200, { "Content-Type": "application/x-ndjson" });
        res.write('{"message":"one"}\n{"mess');
        setTimeout(() => res.end('age":"two"}\n{"image":{"name":"debian"}}\n'), 20);
        return undefined;
      }
      return answer(500, "plain text");
    });
    server.on("upgrade", async (req, socket, head) => {
      // The request's body follows its head on the connection.
      const want = Number(req.headers["content-length"] ?? 0);
      let buf = Buffer.from(head);
      const it = socket[Symbol.asyncIterator]();
      while (buf.length < want) buf = Buffer.concat([buf, (await it.next()).value]);
      const body = JSON.parse(buf.subarray(0, want).toString());
      seen.push({ method: req.method, url: req.url, headers: req.headers, body: JSON.stringify(body) });
      if (req.url?.startsWith("/v1/sandboxes/missing")) {
        const msg = JSON.stringify({ kind: "not_found", message: "sandbox missing: not found" });
        socket.end(`HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: ${msg.length}\r\n\r\n${msg}`);
        return;
      }
      socket.write("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: molt-exec/1\r\n\r\n");
      if (req.url?.startsWith("/v1/sandboxes/cut/")) {
        // Output, then the connection ends without an exit status.
        socket.end(molt.encodeFrame("o", "partial"));
        return;
      }
      if (req.url?.startsWith("/v1/sandboxes/broken/")) {
        socket.end(Buffer.concat([molt.encodeFrame("o", "x"), molt.encodeFrame("E", "exec: the init went away")]));
        return;
      }
      const frames = [molt.encodeFrame("p", "7"), molt.encodeFrame("o", Buffer.alloc(100000, "a"))];
      if (body.stdin) {
        const r = new molt.FrameReader({ [Symbol.asyncIterator]: () => it }, buf.subarray(want));
        const f = await r.next();
        assert.equal(f?.type, "i");
        assert.equal((await r.next())?.type, "I");
        frames.push(molt.encodeFrame("o", /** @type {Buffer} */ (f?.payload)));
      }
      frames.push(molt.encodeFrame("e", "err"), molt.encodeFrame("x", '{"exit_code":3,"signal":""}'));
      // Byte by byte for the last frames: the client joins them.
      const all = Buffer.concat(frames);
      socket.write(all.subarray(0, all.length - 40));
      for (const b of all.subarray(all.length - 40)) {
        socket.write(Buffer.from([b]));
      }
      socket.end();
    });
    await new Promise((resolve) => server.listen(path, () => resolve(undefined)));
    client = new molt.Client({ socket: path, timeoutMs: 10000 });
  });

  after(() => {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("call and error", async () => {
    const h = await client.host();
    assert.equal(h.version, "v");
    assert.equal(h.pool.loop, true);
    await assert.rejects(client.inspectSandbox("missing"),
      (e) => e instanceof molt.NotFound && e.status === 404 && e.message === "sandbox missing: not found");
    await assert.rejects(client.sandboxes(), molt.Internal);
  });

  test("hibernate with offload", async () => {
    const sb = await client.hibernate("sb1", { offload: true });
    assert.equal(sb.offloaded, true);
    assert.equal(seen[seen.length - 1].url, "/v1/sandboxes/sb1/hibernate?offload=true");
    assert.equal(seen[seen.length - 1].method, "POST");
    assert.equal((await client.offload("sb1")).offloaded, true);
    assert.equal(seen[seen.length - 1].url, "/v1/sandboxes/sb1/offload");
  });

  test("NDJSON progress", async () => {
    const lines = /** @type {string[]} */ ([]);
    const img = await client.buildImage("debian", { onProgress: (m) => lines.push(m) });
    assert.equal(img.name, "debian");
    assert.deepEqual(lines, ["one", "two"]);
  });

  test("exec", async () => {
    const r = await client.exec("sb1", ["cat"], { stdin: "typed", env: { A: "1" }, timeoutMs: 1500 });
    assert.equal(r.exit_code, 3);
    assert.equal(r.pid, 7);
    assert.equal(r.stderrText, "err");
    assert.equal(r.stdoutText, "a".repeat(100000) + "typed");
    const last = seen[seen.length - 1];
    assert.equal(last.url, "/v1/sandboxes/sb1/exec");
    assert.equal(last.headers.upgrade, "molt-exec/1");
    assert.deepEqual(JSON.parse(last.body), { args: ["cat"], env: { A: "1" }, timeout_ms: 1500, stdin: true });
    await assert.rejects(client.exec("missing", ["true"]), molt.NotFound);
  });

  test("a stream that ends or fails before the exit status", async () => {
    const p = await client.execStream("cut", ["sh"]);
    const got = [];
    await assert.rejects((async () => {
      for await (const c of p) got.push(c.text);
    })(), (e) => e instanceof molt.StreamError && /ended before the command's exit status/.test(e.message));
    assert.deepEqual(got, ["partial"]);
    assert.equal(p.result, undefined);
    await assert.rejects(client.exec("broken", ["sh"]),
      (e) => e instanceof molt.StreamError && /the init went away/.test(e.message));
    await assert.rejects(p.write("late"), molt.StreamError);
    assert.throws(() => p.signal(0), RangeError);
  });
});
