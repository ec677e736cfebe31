#!/usr/bin/env node
// Runs the SDK's tests against a live, ephemeral molt daemon.
//
//   node sdk/ts/test/live.mjs --molt bin/molt [--image debian] [-- NODE_TEST_ARGS...]
//
// Starts `molt daemon` on a temporary root with a loop pool and a TLS
// listener on loopback (a self-signed certificate made with openssl),
// builds the debian image through the SDK (from the debootstrap cache,
// /var/cache/molt, after the first build), runs `node --test` on the
// unit and live tests with MOLT_SOCKET set, then removes every sandbox,
// stops the daemon, unmounts the pool and checks that no loop device
// still holds it. Needs root; without it only the unit tests run, unless
// MOLT_REQUIRE_PRIVILEGED=1, where it fails.

import { spawn, spawnSync } from "node:child_process";
import { accessSync, constants, existsSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Client, MoltError } from "../src/index.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const UNIT = join(HERE, "unit.test.mjs");
const LIVE = join(HERE, "live.test.mjs");
// The LangGraph.js saver (sdk/ts/langgraph), with its npm dependencies.
const LANGGRAPH = join(HERE, "..", "langgraph");
const SAVER = join(LANGGRAPH, "test", "saver.test.mjs");

/** @param {string} msg */
const log = (msg) => process.stderr.write(`test-ts: ${msg}\n`);
/** @param {number} ms */
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * @param {string} path
 * @param {number} [n]
 */
function tail(path, n = 4000) {
  try {
    return readFileSync(path).subarray(-n).toString("utf8");
  } catch {
    return "";
  }
}

/** @param {string} path */
function mounted(path) {
  return readFileSync("/proc/self/mountinfo", "utf8").split("\n").some((l) => l.split(" ")[4] === path);
}

/** @param {string} backing */
function loopHolding(backing) {
  for (const dev of readdirSync("/sys/block")) {
    try {
      if (readFileSync(join("/sys/block", dev, "loop", "backing_file"), "utf8").trim() === backing) {
        return dev;
      }
    } catch {
      // not a loop device, or not bound
    }
  }
  return "";
}

/** @returns {Promise<number>} */
function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const addr = s.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      s.close(() => res(port));
    });
  });
}

/**
 * @param {string[]} files
 * @param {Record<string, string | undefined>} env
 * @param {string[]} extra
 * @returns {Promise<number>}
 */
function nodeTest(files, env, extra) {
  return new Promise((res) => {
    const p = spawn(process.execPath, ["--test", ...extra, ...files], { stdio: "inherit", env, cwd: HERE });
    p.on("exit", (code, sig) => res(code ?? (sig ? 1 : 0)));
  });
}

class Daemon {
  /**
   * @param {string} bin
   * @param {string} tmp
   */
  constructor(bin, tmp) {
    this.bin = bin;
    this.tmp = tmp;
    this.root = join(tmp, "root");
    this.socket = join(tmp, "molt.sock");
    this.log = join(tmp, "daemon.log");
    /** @type {import("node:child_process").ChildProcess | undefined} */
    this.proc = undefined;
    this.exited = false;
    this.endpoint = "";
    this.tlsCA = "";
  }

  async tls() {
    const cert = join(this.tmp, "cert.pem");
    const key = join(this.tmp, "key.pem");
    const r = spawnSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
      "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=molt test",
      "-addext", "subjectAltName=IP:127.0.0.1"], { encoding: "utf8" });
    if (r.status !== 0) {
      throw new Error("openssl: " + (r.stderr || r.error));
    }
    const port = await freePort();
    this.endpoint = `https://127.0.0.1:${port}`;
    this.tlsCA = cert;
    return ["--listen", `tcp://127.0.0.1:${port}`, "--tls-cert", cert, "--tls-key", key];
  }

  async start() {
    const args = ["daemon", "--root", this.root, "--socket", this.socket, "--pool-size", "16G", ...(await this.tls())];
    const fd = openSync(this.log, "a");
    const proc = spawn(this.bin, args, { stdio: ["ignore", fd, fd], detached: true });
    this.proc = proc;
    proc.on("exit", () => { this.exited = true; });
    const c = new Client({ socket: this.socket, timeoutMs: 10000 });
    const deadline = Date.now() + 60000;
    while (Date.now() < deadline && !this.exited) {
      try {
        await c.host();
        return;
      } catch (err) {
        if (!(err instanceof MoltError)) {
          throw err;
        }
        await sleep(100);
      }
    }
    throw new Error("daemon did not come up:\n" + tail(this.log));
  }

  /** Removes every sandbox, stops the daemon, unmounts the pool; returns the problems found. */
  async stop() {
    /** @type {string[]} */
    const problems = [];
    const proc = this.proc;
    if (proc === undefined) {
      return problems;
    }
    if (!this.exited) {
      const c = new Client({ socket: this.socket, timeoutMs: 120000 });
      try {
        for (const sb of await c.sandboxes()) {
          try {
            await c.removeSandbox(sb.id);
          } catch (err) {
            problems.push(`remove sandbox ${sb.id}: ${err}`);
          }
        }
      } catch (err) {
        problems.push(`list sandboxes: ${err}`);
      }
      const gone = new Promise((r) => proc.on("exit", r));
      proc.kill("SIGTERM");
      const stopped = await Promise.race([gone.then(() => true), sleep(15000).then(() => false)]);
      if (!stopped) {
        problems.push("daemon did not stop within 15 s of SIGTERM; killed");
        proc.kill("SIGKILL");
        await gone;
      }
    }
    const pool = join(this.root, "pool");
    if (mounted(pool)) {
      const r = spawnSync("umount", [pool], { encoding: "utf8" });
      if (r.status !== 0) {
        problems.push(`unmount ${pool}: ${(r.stderr || "").trim()}`);
      }
    }
    const img = join(this.root, "pool.img");
    const deadline = Date.now() + 5000;
    for (;;) {
      const held = loopHolding(img);
      if (!held) {
        break;
      }
      if (Date.now() > deadline) {
        problems.push(`loop device ${held} still holds ${img}`);
        break;
      }
      await sleep(50);
    }
    return problems;
  }
}

/** @param {string[]} argv */
function parseArgs(argv) {
  const o = { molt: "bin/molt", image: "debian", /** @type {string[]} */ testArgs: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      o.testArgs = argv.slice(i + 1);
      break;
    } else if (a === "--molt" || a === "--image") {
      const v = argv[++i];
      if (v === undefined) {
        throw new Error(`${a} needs a value`);
      }
      o[a === "--molt" ? "molt" : "image"] = v;
    } else {
      throw new Error(`unknown argument ${a} (want --molt BIN, --image NAME, -- NODE_TEST_ARGS)`);
    }
  }
  return o;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (process.getuid?.() !== 0) {
    if (process.env.MOLT_REQUIRE_PRIVILEGED === "1") {
      log("the live tests need root and MOLT_REQUIRE_PRIVILEGED=1 forbids skipping");
      return 1;
    }
    log("SKIPPED: the live tests need root (they start a daemon); running the unit tests only");
    return nodeTest([UNIT], process.env, args.testArgs);
  }
  const bin = resolve(args.molt);
  try {
    accessSync(bin, constants.X_OK);
  } catch {
    log(`${bin} is not executable: run make build first`);
    return 1;
  }
  const started = Date.now();
  const secs = () => ((Date.now() - started) / 1000).toFixed(1);
  // The saver's dependencies, as its package-lock.json pins them.
  const ci = spawnSync("npm", ["ci", "--no-audit", "--no-fund", "--loglevel=error"],
    { cwd: LANGGRAPH, stdio: ["ignore", "inherit", "inherit"] });
  if (ci.status !== 0) {
    log(`npm ci in ${LANGGRAPH} failed`);
    return 1;
  }
  log(`npm ci in ${LANGGRAPH} (${secs()} s)`);
  const tmp = mkdtempSync(join(tmpdir(), "molt-ts-"));
  const daemon = new Daemon(bin, tmp);
  let code = 1;
  try {
    await daemon.start();
    log(`daemon up at ${daemon.socket} (${secs()} s)`);
    const c = new Client({ socket: daemon.socket });
    /** @type {string[]} */
    const lines = [];
    const img = await c.buildImage(args.image, { onProgress: (m) => lines.push(m) });
    log(`image ${img.name} ready (${lines.length} progress lines, ${secs()} s)`);
    const env = {
      ...process.env, MOLT_SOCKET: daemon.socket, MOLT_TEST_IMAGE: args.image,
      MOLT_TEST_BUILD_PROGRESS: String(lines.length), MOLT_TEST_ENDPOINT: daemon.endpoint,
      MOLT_TEST_TLS_CA: daemon.tlsCA, MOLT_ENDPOINT: "", MOLT_TOKEN: "",
    };
    code = await nodeTest([UNIT, LIVE, SAVER], env, args.testArgs);
  } catch (err) {
    log(`${err instanceof Error ? err.stack : err}`);
    log("daemon log:\n" + tail(daemon.log));
    code = 1;
  } finally {
    const problems = await daemon.stop();
    for (const p of problems) {
      log("teardown: " + p);
    }
    if (problems.length) {
      code = code || 1;
      log("daemon log:\n" + tail(daemon.log));
    } else if (code !== 0) {
      log("daemon log tail:\n" + tail(daemon.log, 2000));
    }
    if (existsSync(tmp)) {
      rmSync(tmp, { recursive: true, force: true });
    }
    log(`done in ${secs()} s`);
  }
  return code;
}

process.exitCode = await main();
