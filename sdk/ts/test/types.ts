// Uses the SDK's surface as a TypeScript program would; `tsc -p sdk/ts`
// checks it against src/index.d.ts (it is never run: test/live.test.mjs
// runs the same calls against a daemon).

import {
  Client, CommandFailed, MoltError, NotFound, OutputChunk, Sandbox,
  type Checkpoint, type ExecResult, type RollbackResult, type SessionResult, type TurnResult,
} from "@molt-sh/molt";

export async function agent(c: Client): Promise<number> {
  const sb: Sandbox = await c.sandbox({ image: "debian", resources: { pids: 64 }, effectPolicy: { payment: "refuse" } });
  return sb.use(async () => {
    const r: SessionResult = await sb.run("cd /tmp && make", { timeoutMs: 1000 });
    const ck: Checkpoint = await sb.checkpoint("before", { kind: "full", wait: true });
    const turn: TurnResult = await sb.checkpoint(undefined, { kind: "auto" });
    const e: ExecResult = await sb.exec(["true"], { stdin: "x", onOutput: (ch: OutputChunk) => ch.text });
    const p = await sb.execStream(["cat"], { stdin: true });
    await p.write(new Uint8Array([1, 2]));
    await p.closeStdin();
    for await (const ch of p) {
      const s: "stdout" | "stderr" = ch.stream;
      void s;
    }
    const code: number | undefined = p.result?.exit_code;
    const rb: RollbackResult = await sb.rollback(ck, { tier: "warm", dryRun: true });
    const forks = await sb.fork(2, { checkpoint: ck });
    for (const f of forks) {
      await f.exec(["true"], { check: true });
    }
    await forks.remove();
    try {
      await c.inspectSandbox("nope");
    } catch (err) {
      if (err instanceof NotFound || err instanceof CommandFailed) {
        const k: string = err.kind;
        void k;
      } else if (err instanceof MoltError) {
        return err.status;
      }
    }
    return r.exit_code + e.exit_code + (code ?? 0) + rb.duration_ms + turn.turn;
  });
}

export function remote(token: string): Client {
  return new Client({ endpoint: "https://127.0.0.1:8443", token, tlsCA: "/etc/molt/ca.pem", timeoutMs: 5000 });
}
