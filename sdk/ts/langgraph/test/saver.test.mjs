// The saver against a live daemon (run by sdk/ts/test/live.mjs, which
// starts one, sets MOLT_SOCKET and runs `npm ci` here first).
//
// A small agent graph: a scripted fake model proposes shell commands, a
// tool node runs them in the thread's molt sandbox (a persistent session,
// so shell variables and background processes count), and the model
// answers once its script is done. Time travel and a forked thread must
// find the sandbox as it was at that step: files, session state, processes;
// so must a branch made with updateState.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { AIMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { Client } from "@molt-sh/molt";

import { MoltSaver } from "@molt-sh/langgraph";

const IMAGE = process.env.MOLT_TEST_IMAGE || "debian";
const skip = process.env.MOLT_SOCKET ? false : "needs a live daemon: run sdk/ts/test/live.mjs";

// What the fake model asks for, one command per turn: each appends to a
// file, counts in a shell variable, and the first starts a process the
// second kills.
const SCRIPT = [
  "echo one >> /work.txt; n=$((n+1)); sleep 1000 & echo $! > /bg.pid",
  "echo two >> /work.txt; n=$((n+1)); kill $(cat /bg.pid)",
  "echo three >> /work.txt; n=$((n+1))",
];

/** @param {MoltSaver} saver */
function agentGraph(saver) {
  /** @param {typeof MessagesAnnotation.State} state */
  const model = (state) => {
    const done = state.messages.filter((m) => m instanceof ToolMessage).length;
    if (done >= SCRIPT.length) {
      return { messages: [new AIMessage("done")] };
    }
    return {
      messages: [new AIMessage({
        content: "",
        tool_calls: [{ id: `call-${done}`, name: "sh", args: { command: SCRIPT[done] } }],
      })],
    };
  };
  /**
   * @param {typeof MessagesAnnotation.State} state
   * @param {import("@langchain/core/runnables").RunnableConfig} config
   */
  const tools = async (state, config) => {
    const last = /** @type {AIMessage} */ (state.messages[state.messages.length - 1]);
    const sb = await saver.sandbox(config);
    const out = [];
    for (const call of last.tool_calls ?? []) {
      const r = await sb.run(String(call.args.command));
      out.push(new ToolMessage({ tool_call_id: String(call.id), content: `exit ${r.exit_code}\n${r.stdout}` }));
    }
    return { messages: out };
  };
  /** @param {typeof MessagesAnnotation.State} state */
  const route = (state) => {
    const last = /** @type {AIMessage} */ (state.messages[state.messages.length - 1]);
    return last.tool_calls?.length ? "tools" : END;
  };
  return new StateGraph(MessagesAnnotation)
    .addNode("model", model)
    .addNode("tools", tools)
    .addEdge(START, "model")
    .addConditionalEdges("model", route, ["tools", END])
    .addEdge("tools", "model")
    .compile({ checkpointer: saver });
}

/**
 * What the sandbox holds: the file, the session's counter, whether the
 * background process lives.
 * @param {import("@molt-sh/molt").Sandbox} sb
 */
async function observe(sb) {
  const r = await sb.run("cat /work.txt 2>/dev/null | tr '\\n' ' '; echo \"| n=${n:-0} |\"; "
    + "if [ -f /bg.pid ] && kill -0 $(cat /bg.pid) 2>/dev/null; then echo alive; else echo dead; fi");
  return r.stdout.trim().replace(/\s+/g, " ");
}

describe("MoltSaver", { skip }, () => {
  test("time travel and a forked thread rewind and fork the sandbox", async (t) => {
    const client = new Client();
    const saver = new MoltSaver({ client, sandbox: { image: IMAGE } });
    t.after(async () => {
      await saver.deleteThread("t1");
      await saver.deleteThread("t2");
    });
    const graph = agentGraph(saver);
    const t1 = { configurable: { thread_id: "t1" } };

    const final = await graph.invoke({ messages: [new HumanMessage("work")] }, t1);
    assert.equal(final.messages[final.messages.length - 1].content, "done");
    const sb1 = await saver.sandbox(t1);
    assert.equal(await observe(sb1), "one two three | n=3 | dead");

    // The checkpoint right after the first tool step: the next node is the model.
    /** @type {import("@langchain/langgraph").StateSnapshot[]} */
    const history = [];
    for await (const s of graph.getStateHistory(t1)) history.push(s);
    /** @param {import("@langchain/langgraph").StateSnapshot} s */
    const tools = (s) => /** @type {unknown[]} */ (s.values.messages).filter((m) => m instanceof ToolMessage).length;
    const afterFirst = history.find((s) => tools(s) === 1
      && s.next.includes("model"));
    assert.ok(afterFirst, "no checkpoint after the first tool step");
    const at = afterFirst.config;

    // Reading it moves the sandbox there: files, the session's variable,
    // and the background process the second step killed.
    await graph.getState(at);
    assert.equal(await observe(sb1), "one | n=1 | alive");

    // Fork the thread at that step: its own sandbox, from the same state.
    const t2 = await saver.forkThread(at, "t2");
    const sb2 = await saver.sandbox(t2);
    assert.notEqual(sb2.id, sb1.id);
    assert.equal(await observe(sb2), "one | n=1 | alive");

    // Time travel on t1: resume from that checkpoint. The run redoes steps
    // two and three on the rolled-back sandbox (appending again would show
    // if it had not been rolled back).
    const resumed = await graph.invoke(null, at);
    assert.equal(resumed.messages[resumed.messages.length - 1].content, "done");
    assert.equal(await observe(sb1), "one two three | n=3 | dead");

    // The fork runs on its own, and t1's sandbox does not see it.
    await sb2.run("echo fork-only > /fork.txt");
    const forked = await graph.invoke(null, t2);
    assert.equal(forked.messages[forked.messages.length - 1].content, "done");
    assert.equal(await observe(sb2), "one two three | n=3 | dead");
    assert.equal((await sb1.exec(["test", "-e", "/fork.txt"])).exit_code, 1);

    // Continuing t1 at its head after reading an old checkpoint puts the
    // sandbox back at the head.
    await graph.getState(at);
    assert.equal(await observe(sb1), "one | n=1 | alive");
    const head = await graph.getState(t1);
    assert.equal(head.next.length, 0);
    assert.equal(await observe(sb1), "one two three | n=3 | dead");

    // A branch inside the thread: updating the state at that checkpoint
    // loads it (the sandbox goes back there) and stores the branch's
    // checkpoint with a molt checkpoint of that state; the run goes on
    // from it.
    const branch = await graph.updateState(at, { messages: [new HumanMessage("go on")] });
    assert.equal(await observe(sb1), "one | n=1 | alive");
    await graph.getState(t1); // the head, which is now the branch
    assert.equal(await observe(sb1), "one | n=1 | alive");
    const done = await graph.invoke(null, branch);
    assert.equal(done.messages[done.messages.length - 1].content, "done");
    assert.equal(await observe(sb1), "one two three | n=3 | dead");
  });
});
