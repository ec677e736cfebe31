// Tests of the SDK against a live daemon (run by test/live.mjs, which
// starts one and sets MOLT_SOCKET; `make test-ts`).

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import * as molt from "@molt-sh/molt";

const IMAGE = process.env.MOLT_TEST_IMAGE || "debian";
const LIVE = Boolean(process.env.MOLT_SOCKET);
const ENDPOINT = process.env.MOLT_TEST_ENDPOINT || "";
const TLS_CA = process.env.MOLT_TEST_TLS_CA || "";
const execFileP = promisify(execFile);
const HERE = dirname(fileURLToPath(import.meta.url));
const skip = LIVE ? false : "needs a live daemon: run sdk/ts/test/live.mjs (make test-ts)";

const client = new molt.Client();

/** @param {string} prefix */
const uniq = (prefix) => `${prefix}-${randomBytes(4).toString("hex")}`;
/** @param {number} ms */
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A sandbox removed at the end of the test.
 * @param {import("node:test").TestContext} t
 * @param {molt.CreateSandboxOptions} [o]
 */
async function sandbox(t, o = {}) {
  const sb = await client.sandbox({ image: IMAGE, ...o });
  t.after(() => sb.remove());
  return sb;
}

/** @param {molt.Ref} ref */
const assertGone = (ref) => assert.rejects(client.inspectSandbox(ref), molt.NotFound);

describe("host", { skip }, () => {
  test("host, images, metrics, audit", async () => {
    const h = await client.host();
    assert.ok(h.version);
    assert.equal(h.pool.loop, true);
    assert.ok(h.pool.size_bytes > 0);
    assert.ok((await client.images()).some((i) => i.name === IMAGE));
    assert.equal((await client.image(IMAGE)).name, IMAGE);
    // The harness built the image through the NDJSON progress stream.
    assert.ok(Number(process.env.MOLT_TEST_BUILD_PROGRESS) > 0);
    assert.match(await client.metrics(), /molt_sandboxes/);
    const entries = (await client.auditExport()).toString().split("\n").filter(Boolean).map((l) => JSON.parse(l));
    assert.ok(entries.some((e) => String(e.path ?? e.route ?? "").includes("/v1/host")));
    const v = await client.auditVerify();
    assert.equal(v.ok, true);
    assert.ok(v.entries >= entries.length);
  });
});

describe("sandboxes", { skip }, () => {
  test("create, list, inspect, remove", async () => {
    const name = uniq("ts");
    const sb = await client.sandbox({ image: IMAGE, name, env: { GREETING: "hi" }, resources: { pids: 512 } });
    try {
      assert.equal(sb.name, name);
      assert.equal(sb.state, "running");
      assert.ok(sb.info.env_names?.includes("GREETING"));
      assert.ok((await client.sandboxes()).some((s) => s.id === sb.id));
      const byName = await client.inspectSandbox(name);
      assert.equal(byName.id, sb.id);
      assert.equal(byName.resources?.pids, 512);
      assert.equal((await sb.exec(["sh", "-c", "echo $GREETING"])).stdoutText, "hi\n");
      await assert.rejects(client.sandbox({ image: IMAGE, name }), molt.AlreadyExists);
    } finally {
      await sb.remove();
    }
    await assertGone(sb.id);
    await sb.remove(); // a second remove is not an error
  });

  test("stop, start", async (t) => {
    const sb = await sandbox(t);
    assert.equal((await sb.stop()).state, "stopped");
    await assert.rejects(sb.exec(["true"]), molt.FailedPrecondition);
    assert.equal((await sb.start()).state, "running");
    assert.equal((await sb.exec(["true"])).exit_code, 0);
  });

  test("use() removes, on a throw too", async () => {
    let id = "";
    await (await client.sandbox({ image: IMAGE })).use(async (sb) => {
      id = sb.id;
      assert.equal((await client.inspectSandbox(id)).state, "running");
    });
    await assertGone(id);
    const made = await molt.Sandbox.create({ image: IMAGE, client });
    await assert.rejects(made.use(() => { throw new Error("agent step failed"); }), /agent step failed/);
    await assertGone(made.id);
    const other = await client.sandbox({ image: IMAGE });
    const again = await client.attach(other.id);
    assert.equal(again.id, other.id);
    await again.remove();
    await assertGone(other.id);
  });
});

describe("exec", { skip }, () => {
  /** @type {molt.Sandbox} */
  let sb;
  before(async () => { if (LIVE) sb = await client.sandbox({ image: IMAGE }); });
  after(async () => { await sb?.remove(); });

  test("exit codes and output", async () => {
    const r = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert.equal(r.exit_code, 3);
    assert.equal(r.ok, false);
    assert.equal(r.stdoutText, "out\n");
    assert.equal(r.stderrText, "err\n");
    assert.ok(r.pid && r.pid > 0);
    assert.equal((await sb.exec(["true"])).exit_code, 0);
    assert.equal((await sb.exec(["no-such-command"])).exit_code, 127);
    await assert.rejects(sb.exec(["sh", "-c", "echo boom >&2; exit 2"], { check: true }),
      (e) => e instanceof molt.CommandFailed && /boom/.test(e.message)
        && /** @type {molt.ExecResult} */ (e.result).exit_code === 2);
  });

  test("streaming with for await", async () => {
    const start = Date.now();
    /** @type {[string, string, number][]} */
    const got = [];
    const p = await sb.execStream(["sh", "-c", "echo first; sleep 2; echo second >&2"]);
    for await (const c of p) {
      got.push([c.stream, c.text, Date.now() - start]);
    }
    assert.equal(p.result?.exit_code, 0);
    assert.deepEqual(got[0].slice(0, 2), ["stdout", "first\n"]);
    assert.deepEqual(got[got.length - 1].slice(0, 2), ["stderr", "second\n"]);
    // The first line came while the command still ran, not at its end.
    assert.ok(got[got.length - 1][2] - got[0][2] > 1000, JSON.stringify(got));
  });

  test("env, cwd, stdin, large output", async () => {
    const r = await sb.exec(["sh", "-c", "pwd; echo $A; cat"], { env: { A: "b" }, cwd: "/tmp", stdin: "piped\n" });
    assert.equal(r.stdoutText, "/tmp\nb\npiped\n");
    const big = await sb.exec(["head", "-c", String(6 << 20), "/dev/zero"]);
    assert.equal(big.stdout.length, 6 << 20);
    // stdin from an async iterable, larger than a frame's chunk.
    async function* gen() {
      for (let i = 0; i < 4; i++) yield Buffer.alloc(100000, 97 + i);
    }
    const counted = await sb.exec(["sh", "-c", "wc -c"], { stdin: gen() });
    assert.equal(counted.stdoutText.trim(), "400000");
    const p = await sb.execStream(["cat"], { stdin: true });
    await p.write("interactive\n");
    await p.closeStdin();
    const res = await p.wait();
    assert.equal(res.stdoutText, "interactive\n");
  });

  test("timeout and signal", async () => {
    const r = await sb.exec(["sleep", "30"], { timeoutMs: 500 });
    assert.equal(r.timed_out, true);
    assert.equal(r.exit_code, 124);
    const p = await sb.execStream(["sleep", "30"]);
    setTimeout(() => p.signal(15), 500);
    const res = await p.wait();
    assert.equal(res.exit_code, 128 + 15);
    assert.ok(res.signal);
  });

  test("closing a stream kills the command", async () => {
    const p = await sb.execStream(["sh", "-c", "echo $$ > /tmp/closed; echo up; exec sleep 300"]);
    for await (const c of p) {
      assert.equal(c.text, "up\n");
      break;
    }
    p.close();
    const pid = (await sb.exec(["cat", "/tmp/closed"])).stdoutText.trim();
    const deadline = Date.now() + 10000;
    while ((await sb.exec(["kill", "-0", pid])).exit_code === 0) {
      assert.ok(Date.now() < deadline, "the command outlived its stream");
      await sleep(100);
    }
  });

  test("detached", async () => {
    const pid = await sb.execDetached(["sh", "-c", "echo bg > /tmp/detached"]);
    assert.ok(pid > 0);
    const deadline = Date.now() + 10000;
    while ((await sb.exec(["cat", "/tmp/detached"])).stdoutText !== "bg\n") {
      assert.ok(Date.now() < deadline, "the detached command never wrote its file");
      await sleep(100);
    }
  });
});

describe("sessions", { skip }, () => {
  test("a session keeps its state", async (t) => {
    const sb = await sandbox(t);
    assert.equal((await sb.run("cd /tmp && X=42 && echo set")).stdout, "set\n");
    let r = await sb.run("echo $X $PWD");
    assert.deepEqual([r.stdout, r.exit_code], ["42 /tmp\n", 0]);
    r = await sb.run("echo oops >&2; false");
    assert.deepEqual([r.exit_code, r.stderr], [1, "oops\n"]);
    await assert.rejects(sb.run("exit 5", { session: "other", check: true }), molt.CommandFailed);
    // Sessions are separate; closing one loses its state.
    assert.equal((await sb.run("echo ${X:-unset}", { session: "other" })).stdout, "unset\n");
    assert.ok((await sb.refresh()).sessions?.some((s) => s.name === "main"));
    await sb.closeSession("main");
    assert.equal((await sb.run("echo ${X:-unset}")).stdout, "unset\n");
    assert.equal((await sb.run("sleep 30", { timeoutMs: 500 })).timed_out, true);
  });
});

describe("checkpoints", { skip }, () => {
  test("full checkpoint and rollback", async (t) => {
    const sb = await sandbox(t);
    await sb.run("echo one > /state; counter=5; sleep 1000 & echo $! > /bgpid");
    const ck = await sb.checkpoint("one", { kind: "full", wait: true });
    assert.deepEqual([ck.kind, ck.label, ck.sandbox], ["full", "one", sb.id]);
    assert.ok(!ck.pending);
    assert.ok(ck.bytes_written > 0);
    await sb.run("echo two > /state; counter=9; kill $(cat /bgpid)");
    assert.equal((await sb.run("cat /state; echo $counter")).stdout, "two\n9\n");

    const res = await sb.rollback(ck);
    assert.equal(res.checkpoint, ck.id);
    assert.ok(["hot", "warm", "cold"].includes(res.tier), res.tier);
    assert.equal(res.processes_restarted, false);
    // Files, the session's shell variable and the background process are back.
    assert.equal((await sb.run("cat /state; echo $counter")).stdout, "one\n5\n");
    assert.equal((await sb.run("kill -0 $(cat /bgpid) && echo alive")).stdout, "alive\n");

    assert.equal((await client.inspectCheckpoint(ck.id)).label, "one");
    assert.equal((await client.verifyCheckpoint(ck.id)).id, ck.id);
    const chain = await client.verifyChain(ck.id);
    assert.equal(chain.ok, true);
    assert.equal(chain.links[0].id, ck.id);
    assert.equal((await sb.rollback("one", { tier: "warm" })).tier, "warm");
    const plan = await sb.rollback(ck, { dryRun: true });
    assert.equal(plan.checkpoint, ck.id);
    assert.equal(plan.plan?.dry_run, true);
  });

  test("fs checkpoints, the tree, delete", async (t) => {
    const sb = await sandbox(t);
    /** @param {string} s */
    const put = (s) => sb.exec(["sh", "-c", `echo ${s} > /f`], { check: true });
    await put("a");
    const a = await sb.checkpoint("a");
    assert.equal(a.kind, "fs");
    await put("b");
    const b = await sb.checkpoint("b");
    await sb.rollback(a);
    assert.equal((await sb.exec(["cat", "/f"])).stdoutText, "a\n");
    await put("c");
    const c = await sb.checkpoint("c");
    assert.deepEqual((await sb.checkpoints()).map((x) => x.id).slice(-3), [a.id, b.id, c.id]);
    /** @type {(nodes: molt.Checkpoint[], id: string) => molt.Checkpoint | undefined} */
    const find = (nodes, id) => {
      for (const n of nodes) {
        const hit = n.id === id ? n : find(n.children ?? [], id);
        if (hit) return hit;
      }
      return undefined;
    };
    const node = find(await sb.checkpointTree(), a.id);
    assert.deepEqual(node?.children?.map((x) => x.id).sort(), [b.id, c.id].sort());
    await sb.rollback(b);
    assert.equal((await sb.exec(["cat", "/f"])).stdoutText, "b\n");
    await client.deleteCheckpoint(c.id);
    await assert.rejects(client.inspectCheckpoint(c.id), molt.NotFound);
    await assert.rejects(sb.rollback("no-such-label"), molt.NotFound);
  });
});

describe("fork", { skip }, () => {
  test("fork", async (t) => {
    const sb = await sandbox(t);
    await sb.exec(["sh", "-c", "echo parent > /who"]);
    const forks = await sb.fork(2);
    const ids = forks.sandboxes.map((f) => f.id);
    await forks.use(async () => {
      assert.equal(forks.length, 2);
      assert.ok(forks.checkpoint);
      assert.ok(!ids.includes(sb.id));
      for (const f of forks) {
        assert.equal((await f.exec(["cat", "/who"])).stdoutText, "parent\n");
      }
      await forks.sandboxes[0].exec(["sh", "-c", "echo fork0 > /who"]);
      assert.equal((await forks.sandboxes[1].exec(["cat", "/who"])).stdoutText, "parent\n");
      assert.equal((await sb.exec(["cat", "/who"])).stdoutText, "parent\n");
      const more = await client.forkCheckpoint(forks.checkpoint, 1);
      assert.equal(more.sandboxes.length, 1);
      await client.removeSandbox(more.sandboxes[0].id);
    });
    for (const id of ids) {
      await assertGone(id);
    }
  });
});

describe("portable", { skip }, () => {
  test("commit, export, import", async (t) => {
    const sb = await sandbox(t);
    await sb.run("mkdir -p /srv && echo committed > /srv/mark && cd /srv && export STEP=2");
    const img = await sb.commit(uniq("img"));
    t.after(() => client.removeImage(img.name));
    const made = await client.sandbox({ image: img.name });
    await made.use(async () => {
      assert.equal((await made.run("cat /srv/mark")).stdout, "committed\n");
    });

    const ck = await sb.checkpoint("portable", { kind: "full", wait: true });
    const dir = mkdtempSync(join(tmpdir(), "molt-ts-bundle-"));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const file = join(dir, "ck.molt");
    const n = await client.exportCheckpoint(ck, file);
    assert.equal(n, statSync(file).size);
    /** @type {any[]} */
    const seen = [];
    const imp = await client.importCheckpoint(file, { progress: (p) => { seen.push(p); } });
    assert.notEqual(imp.checkpoint.id, ck.id);
    assert.equal(imp.checkpoint.imported_from, ck.id);
    assert.ok(seen.some((p) => p.message === "validating the CRIU images"), JSON.stringify(seen));
    const res = await client.forkCheckpoint(imp.checkpoint.id);
    const f = await client.attach(res.sandboxes[0].id);
    t.after(() => f.remove());
    assert.equal((await f.run("echo $STEP; pwd; cat mark")).stdout, "2\n/srv\ncommitted\n");

    const bad = Buffer.from(readFileSync(file));
    bad[bad.length >> 1] ^= 1;
    writeFileSync(join(dir, "bad.molt"), bad);
    await assert.rejects(client.importCheckpoint(join(dir, "bad.molt")), molt.InvalidArgument);
  });
});

describe("hibernate", { skip }, () => {
  test("hibernate, resume", async (t) => {
    const sb = await sandbox(t);
    await sb.run("kept=yes");
    /** @type {any[]} */
    const seen = [];
    const progress = (/** @type {any} */ p) => { seen.push(p); };
    assert.equal((await sb.hibernate({ progress })).state, "hibernated");
    assert.ok(seen.some((p) => p.message === "capturing processes and files"), JSON.stringify(seen));
    assert.ok(seen.some((p) => String(p.message).endsWith("(new pages only)") && p.unit === "bytes"), JSON.stringify(seen));
    assert.equal((await sb.resume({ progress })).state, "running");
    assert.ok(seen.some((p) => String(p.message).startsWith("restoring from checkpoint")), JSON.stringify(seen));
    assert.equal((await sb.run("echo $kept")).stdout, "yes\n");
    // A fork of many reports how many are made; an error ends the
    // stream as the typed error.
    /** @type {any[]} */
    const made = [];
    const res = await client.fork(sb.id, 2, { progress: (p) => { made.push(p); } });
    for (const f of res.sandboxes) {
      await client.removeSandbox(f.id);
    }
    assert.deepEqual([made.at(-1)?.done, made.at(-1)?.total], [2, 2], JSON.stringify(made));
    await assert.rejects(client.hibernate("no-such-sandbox", { progress }), molt.NotFound);
  });
});

describe("turns", { skip }, () => {
  test("turns, effects, the LLM endpoint", async (t) => {
    const sb = await sandbox(t);
    await sb.run("echo x > /turnfile");
    const tr = await sb.endTurn({ label: "t1" });
    assert.ok(["fs", "full"].includes(tr.decision));
    assert.ok(tr.checkpoint);
    const turns = await sb.turns();
    assert.equal(turns[turns.length - 1].turn, tr.turn);
    assert.ok((turns[turns.length - 1].commands ?? []).some((c) => String(c.command ?? "").includes("turnfile")));
    const auto = await sb.checkpoint("t2", { kind: "auto" });
    assert.equal(auto.turn, tr.turn + 1);
    const rec = await sb.recover({ dryRun: true });
    assert.equal(rec.dry_run, true);
    assert.ok([tr.checkpoint, auto.checkpoint].includes(rec.checkpoint));

    const e = await sb.declareEffect({
      method: "POST", url: "https://pay.example/charge", type: "payment", body: "{}", dependsOn: [],
    });
    assert.equal(e.declared, true);
    assert.equal(e.type, "payment");
    assert.ok((await sb.effects()).some((x) => x.id === e.id));
    assert.equal((await client.consumeEffect(e.id, "billing")).consumers?.[0].by, "billing");
    const comp = await client.setCompensator(e.id, {
      method: "POST", url: "https://pay.example/refund", body: '{"charge": 1}',
    });
    assert.equal(comp.compensator?.url, "https://pay.example/refund");
    // With a compensator, a rollback past the consumed effect plans to
    // compensate it (a dry run: nothing is sent).
    const plan = (await sb.rollback(/** @type {string} */ (tr.checkpoint), { dryRun: true })).plan;
    assert.ok(plan?.compensate?.includes(e.id), JSON.stringify(plan));

    const ep = await sb.setLLM("http://127.0.0.1:9", { gate: "exec" });
    assert.ok(ep.token);
    assert.ok(ep.url.includes("/t/" + ep.token));
    assert.ok(!(await sb.llm()).url.includes(String(ep.token)));
    await assert.rejects(sb.setLLM("http://127.0.0.1:9", { listen: "0.0.0.0:0" }), molt.InvalidArgument);
    await sb.removeLLM();
    await assert.rejects(sb.llm(), molt.NotFound);
    assert.equal((await sb.recovery()).state, "none");
  });
});

describe("errors", { skip }, () => {
  test("typed errors", async (t) => {
    await assert.rejects(client.inspectSandbox("no-such-sandbox"),
      (e) => e instanceof molt.NotFound && e.kind === "not_found" && e.status === 404 && Boolean(e.message));
    await assert.rejects(client.exec("no-such-sandbox", ["true"]), molt.NotFound);
    await assert.rejects(client.sandbox({ image: IMAGE, name: "-not a name" }),
      (e) => e instanceof molt.InvalidArgument && e.status === 400);
    await assert.rejects(client.sandbox({ image: "no-such-image" }), molt.NotFound);
    const sb = await sandbox(t);
    await assert.rejects(sb.fork(0), molt.InvalidArgument); // an explicit 0 is refused, never read as one
    await assert.rejects(sb.exec(["true"], { env: { "BAD=NAME": "x" } }), molt.InvalidArgument);
    // The transport is not part of the surface.
    await assert.rejects(client.t.call("PUT", "/v1/host"), molt.MethodNotAllowed);
  });
});

describe("remote", { skip }, () => {
  test("a tenant's token over TLS", async (t) => {
    assert.ok(ENDPOINT, "the harness gave no TLS endpoint (MOLT_TEST_ENDPOINT)");
    const tenant = uniq("t");
    await client.createTenant(tenant);
    /** @type {molt.Sandbox | undefined} */
    let made;
    // after hooks run in the order they were added: one hook, the
    // tenant's sandbox before the tenant.
    t.after(async () => {
      await made?.remove();
      await client.deleteTenant(tenant);
    });
    const tok = await client.createToken(tenant, { note: "ts sdk test" });
    assert.ok(tok.token);
    assert.ok((await client.tokens(tenant)).some((x) => x.id === tok.id && !x.token));
    const remote = new molt.Client({ endpoint: ENDPOINT, token: tok.token, tlsCA: TLS_CA });
    // Creating a sandbox is the host admin's; the tenant's token works in it.
    await assert.rejects(remote.sandbox({ image: IMAGE }), molt.PermissionDenied);
    made = await client.sandbox({ image: IMAGE, tenant });
    const sb = await remote.attach(made.id);
    assert.equal(sb.info.tenant, tenant);
    // The exec stream's upgrade over TLS, streamed.
    const p = await sb.execStream(["sh", "-c", "echo over tls; cat; exit 4"], { stdin: true });
    await p.write("typed\n");
    await p.closeStdin();
    const r = await p.wait();
    assert.deepEqual([r.exit_code, r.stdoutText], [4, "over tls\ntyped\n"]);
    assert.equal((await sb.run("echo hi")).stdout, "hi\n");
    assert.deepEqual((await remote.sandboxes()).map((s) => s.id), [sb.id]);
    const ck = await sb.checkpoint("remote");
    assert.equal((await sb.rollback(ck)).checkpoint, ck.id);
    await assert.rejects(new molt.Client({ endpoint: ENDPOINT, token: "not-a-token", tlsCA: TLS_CA }).sandboxes(),
      molt.Unauthenticated);
    await assert.rejects(remote.tenants(), molt.PermissionDenied);
    // The system's roots do not trust the test's certificate.
    await assert.rejects(new molt.Client({ endpoint: ENDPOINT, token: tok.token, tlsCA: "" }).sandboxes(),
      molt.ConnectionFailed);
    await client.deleteToken(/** @type {string} */ (tok.id));
    await assert.rejects(remote.sandboxes(), molt.Unauthenticated);
  });
});

/**
 * Runs a README's first js block after `after` with node, as a module
 * next to the package (so that its import resolves to it), and resolves
 * to what it wrote on stdout.
 *
 * @param {string} path
 * @param {string} after
 * @returns {Promise<string>}
 */
async function runReadme(path, after) {
  const readme = readFileSync(path, "utf8");
  const m = /```js\n([\s\S]*?)```/.exec(readme.slice(readme.indexOf(after)));
  assert.ok(m, `${path} has no js block after ${after}`);
  const file = join(HERE, `readme-${randomBytes(4).toString("hex")}.mjs`);
  writeFileSync(file, m[1]);
  try {
    const { stdout } = await execFileP(process.execPath, [file], { timeout: 120000 });
    return stdout;
  } finally {
    rmSync(file, { force: true });
  }
}

describe("readme", { skip }, () => {
  test("the README's agent loop runs as written", async () => {
    const out = await runReadme(join(HERE, "..", "README.md"), "## An agent loop");
    assert.deepEqual(out.trimEnd().split("\n"), ["step 1: exit 0", "step 2: exit 1, rolled back", "step 3: exit 0", "notes: one three"]);
  });

  test("the root README's quick start runs as written", async () => {
    const before = new Set((await client.sandboxes()).map((s) => s.id));
    const out = await runReadme(join(HERE, "..", "..", "..", "README.md"), "## From code");
    // make is not in the image: the step fails (127) and is rolled back.
    assert.match(out, /make: not found/);
    // Its sandbox and forks are gone.
    assert.deepEqual((await client.sandboxes()).filter((s) => !before.has(s.id)), []);
  });
});
