"""Tests of the SDK against a live daemon (run by tests/live.py, which
starts one and sets MOLT_SOCKET; `make test-python`)."""

import json
import os
import threading
import time
import unittest
import uuid

import molt

IMAGE = os.environ.get("MOLT_TEST_IMAGE", "debian")
LIVE = bool(os.environ.get("MOLT_SOCKET"))


def uniq(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@unittest.skipUnless(LIVE, "needs a live daemon: run sdk/python/tests/live.py (make test-python)")
class LiveTest(unittest.TestCase):
    client: molt.Client

    @classmethod
    def setUpClass(cls):
        cls.client = molt.Client()

    def sandbox(self, **kw):
        sb = self.client.sandbox(image=IMAGE, **kw)
        self.addCleanup(sb.remove)
        return sb

    def assertGone(self, ref):
        with self.assertRaises(molt.NotFound):
            self.client.inspect_sandbox(ref)


class Host(LiveTest):
    def test_host_and_images(self):
        h = self.client.host()
        self.assertTrue(h.version)
        self.assertTrue(h.pool.loop)
        self.assertGreater(h.pool.size_bytes, 0)
        self.assertIn(IMAGE, [i.name for i in self.client.images()])
        self.assertEqual(self.client.image(IMAGE).name, IMAGE)
        # The harness built the image through the NDJSON progress stream.
        self.assertGreater(int(os.environ.get("MOLT_TEST_BUILD_PROGRESS", "0")), 0)
        self.assertIn("molt_sandboxes", self.client.metrics())

    def test_audit(self):
        self.client.host()
        entries = [json.loads(ln) for ln in self.client.audit_export().splitlines()]
        self.assertTrue(any("/v1/host" in (e.get("path") or e.get("route") or "") for e in entries), entries[-3:])
        res = self.client.audit_verify()
        self.assertTrue(res.ok, res)
        self.assertGreaterEqual(res.entries, len(entries))


class Sandboxes(LiveTest):
    def test_create_list_inspect_remove(self):
        name = uniq("py")
        sb = self.client.sandbox(image=IMAGE, name=name, env={"GREETING": "hi"},
                                 resources={"pids": 512})
        try:
            self.assertEqual(sb.name, name)
            self.assertEqual(sb.state, "running")
            self.assertIn("GREETING", sb.info.env_names)
            self.assertIn(sb.id, [s.id for s in self.client.sandboxes()])
            by_name = self.client.inspect_sandbox(name)
            self.assertEqual(by_name.id, sb.id)
            self.assertEqual(by_name.resources.pids, 512)
            self.assertEqual(sb.exec(["sh", "-c", "echo $GREETING"]).stdout, b"hi\n")
            with self.assertRaises(molt.AlreadyExists):
                self.client.sandbox(image=IMAGE, name=name)
        finally:
            sb.remove()
        self.assertGone(sb.id)
        sb.remove()  # a second remove is not an error

    def test_stop_start(self):
        sb = self.sandbox()
        self.assertEqual(sb.stop().state, "stopped")
        with self.assertRaises(molt.FailedPrecondition):
            sb.exec(["true"])
        self.assertEqual(sb.start().state, "running")
        self.assertEqual(sb.exec(["true"]).exit_code, 0)

    def test_context_manager_removes(self):
        with self.client.sandbox(image=IMAGE) as sb:
            ident = sb.id
            self.assertEqual(self.client.inspect_sandbox(ident).state, "running")
        self.assertGone(ident)

        # On an exception too, and with molt.Sandbox's own client.
        with self.assertRaises(RuntimeError):
            with molt.Sandbox(image=IMAGE) as sb2:
                ident2 = sb2.id
                raise RuntimeError("agent step failed")
        self.assertGone(ident2)

        # A handle from attach removes too.
        made = self.client.sandbox(image=IMAGE)
        with self.client.attach(made.id) as again:
            self.assertEqual(again.id, made.id)
        self.assertGone(made.id)


class Exec(LiveTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sb = cls.client.sandbox(image=IMAGE)

    @classmethod
    def tearDownClass(cls):
        cls.sb.remove()

    def test_exit_code_and_output(self):
        r = self.sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertEqual(r.exit_code, 3)
        self.assertFalse(r.ok)
        self.assertEqual(r.stdout, b"out\n")
        self.assertEqual(r.stderr, b"err\n")
        self.assertIsNotNone(r.pid)
        self.assertEqual(self.sb.exec(["true"]).exit_code, 0)
        self.assertEqual(self.sb.exec(["no-such-command"]).exit_code, 127)
        with self.assertRaises(molt.CommandFailed) as cm:
            self.sb.exec(["sh", "-c", "echo boom >&2; exit 2"], check=True)
        self.assertEqual(cm.exception.result.exit_code, 2)
        self.assertIn("boom", str(cm.exception))

    def test_streaming(self):
        chunks, times = [], []
        start = time.monotonic()
        with self.sb.exec_stream(["sh", "-c", "echo first; sleep 2; echo second >&2"]) as p:
            for c in p:
                chunks.append(c)
                times.append(time.monotonic() - start)
        self.assertEqual(p.result.exit_code, 0)
        self.assertEqual(chunks[0], molt.OutputChunk("stdout", b"first\n"))
        self.assertEqual(chunks[-1], molt.OutputChunk("stderr", b"second\n"))
        # The first line came while the command still ran, not at its end.
        self.assertGreater(times[-1] - times[0], 1.0)

    def test_env_cwd_stdin_and_large_output(self):
        r = self.sb.exec(["sh", "-c", "pwd; echo $A; cat"], env={"A": "b"}, cwd="/tmp", stdin=b"piped\n")
        self.assertEqual(r.stdout_text, "/tmp\nb\npiped\n")
        big = self.sb.exec(["head", "-c", str(6 << 20), "/dev/zero"])
        self.assertEqual(len(big.stdout), 6 << 20)
        with self.sb.exec_stream(["cat"], stdin=True) as p:
            p.write("interactive\n")
            p.close_stdin()
            res = p.wait()
        self.assertEqual(res.stdout, b"interactive\n")

    def test_timeout_and_signal(self):
        r = self.sb.exec(["sleep", "30"], timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertEqual(r.exit_code, 124)
        with self.sb.exec_stream(["sleep", "30"]) as p:
            threading.Timer(0.5, p.signal, args=(15,)).start()
            res = p.wait()
        self.assertEqual(res.exit_code, 128 + 15)
        self.assertTrue(res.signal)

    def test_detached(self):
        pid = self.sb.exec_detached(["sh", "-c", "echo bg > /tmp/detached"])
        self.assertGreater(pid, 0)
        deadline = time.monotonic() + 10
        while self.sb.exec(["cat", "/tmp/detached"]).stdout != b"bg\n":
            self.assertLess(time.monotonic(), deadline, "the detached command never wrote its file")
            time.sleep(0.1)


class Sessions(LiveTest):
    def test_session_keeps_state(self):
        sb = self.sandbox()
        self.assertEqual(sb.run("cd /tmp && X=42 && echo set").stdout, "set\n")
        r = sb.run("echo $X $PWD")
        self.assertEqual((r.stdout, r.exit_code), ("42 /tmp\n", 0))
        r = sb.run("echo oops >&2; false")
        self.assertEqual((r.exit_code, r.stderr), (1, "oops\n"))
        self.assertFalse(r.ok)
        with self.assertRaises(molt.CommandFailed):
            sb.run("exit 5", session="other", check=True)
        # Sessions are separate; closing one loses its state.
        self.assertEqual(sb.run("echo ${X:-unset}", session="other").stdout, "unset\n")
        self.assertIn("main", [s.name for s in sb.refresh().sessions])
        sb.close_session("main")
        self.assertEqual(sb.run("echo ${X:-unset}").stdout, "unset\n")
        r = sb.run("sleep 30", timeout=0.5)
        self.assertTrue(r.timed_out)


class Checkpoints(LiveTest):
    def test_full_checkpoint_and_rollback(self):
        sb = self.sandbox()
        sb.run("echo one > /state; counter=5; sleep 1000 & echo $! > /bgpid")
        ck = sb.checkpoint("one", kind="full", wait=True)
        self.assertEqual((ck.kind, ck.label, ck.sandbox), ("full", "one", sb.id))
        self.assertFalse(ck.pending)
        self.assertGreater(ck.bytes_written, 0)

        sb.run("echo two > /state; counter=9; kill $(cat /bgpid)")
        self.assertEqual(sb.run("cat /state; echo $counter").stdout, "two\n9\n")

        res = sb.rollback(ck)
        self.assertEqual(res.checkpoint, ck.id)
        self.assertIn(res.tier, ("hot", "warm", "cold"))
        self.assertFalse(res.processes_restarted)
        # Files, the session's shell variable and the background process
        # are back.
        self.assertEqual(sb.run("cat /state; echo $counter").stdout, "one\n5\n")
        self.assertEqual(sb.run("kill -0 $(cat /bgpid) && echo alive").stdout, "alive\n")

        self.assertEqual(self.client.inspect_checkpoint(ck.id).label, "one")
        self.assertEqual(self.client.verify_checkpoint(ck.id).id, ck.id)
        chain = self.client.verify_chain(ck.id)
        self.assertTrue(chain.ok, chain)
        self.assertEqual(chain.links[0].id, ck.id)
        res = sb.rollback("one", tier="warm")
        self.assertEqual(res.tier, "warm")
        plan = sb.rollback(ck, dry_run=True)
        self.assertEqual(plan.checkpoint, ck.id)
        self.assertTrue(plan.plan.dry_run)

    def test_fs_checkpoints_tree_and_delete(self):
        sb = self.sandbox()
        sb.exec(["sh", "-c", "echo a > /f"])
        a = sb.checkpoint("a")
        self.assertEqual(a.kind, "fs")
        sb.exec(["sh", "-c", "echo b > /f"])
        b = sb.checkpoint("b")
        sb.rollback(a)
        self.assertEqual(sb.exec(["cat", "/f"]).stdout, b"a\n")
        sb.exec(["sh", "-c", "echo c > /f"])
        c = sb.checkpoint("c")
        # a has two children, b and c.
        cks = sb.checkpoints()
        self.assertEqual([x.id for x in cks][-3:], [a.id, b.id, c.id])
        roots = sb.checkpoint_tree()
        node = _find(roots, a.id)
        self.assertIsNotNone(node)
        self.assertEqual(sorted(x.id for x in node.children), sorted([b.id, c.id]))
        sb.rollback(b)
        self.assertEqual(sb.exec(["cat", "/f"]).stdout, b"b\n")
        self.client.delete_checkpoint(c.id)
        with self.assertRaises(molt.NotFound):
            self.client.inspect_checkpoint(c.id)
        self.assertNotIn(c.id, [x.id for x in sb.checkpoints()])
        with self.assertRaises(molt.NotFound):
            sb.rollback("no-such-label")


def _find(nodes, ident):
    for n in nodes:
        if n.id == ident:
            return n
        hit = _find(n.children, ident)
        if hit is not None:
            return hit
    return None


class Fork(LiveTest):
    def test_fork(self):
        sb = self.sandbox()
        sb.exec(["sh", "-c", "echo parent > /who"])
        with sb.fork(n=2) as forks:
            self.assertEqual(len(forks), 2)
            self.assertTrue(forks.checkpoint)
            ids = [f.id for f in forks]
            self.assertNotIn(sb.id, ids)
            for f in forks:
                self.assertEqual(f.exec(["cat", "/who"]).stdout, b"parent\n")
            forks[0].exec(["sh", "-c", "echo fork0 > /who"])
            self.assertEqual(forks[1].exec(["cat", "/who"]).stdout, b"parent\n")
            self.assertEqual(sb.exec(["cat", "/who"]).stdout, b"parent\n")
            more = self.client.fork_checkpoint(forks.checkpoint, 1)
            self.assertEqual(len(more.sandboxes), 1)
            self.client.remove_sandbox(more.sandboxes[0].id)
        for i in ids:
            self.assertGone(i)


class Hibernate(LiveTest):
    def test_hibernate_resume(self):
        sb = self.sandbox()
        sb.run("kept=yes")
        seen = []
        self.assertEqual(sb.hibernate(progress=seen.append).state, "hibernated")
        msgs = [p.get("message", "") for p in seen]
        self.assertIn("capturing processes and files", msgs)
        self.assertTrue(any("(new pages only)" in m and p.get("unit") == "bytes" for m, p in zip(msgs, seen)), seen)
        self.assertEqual(sb.resume(progress=seen.append).state, "running")
        self.assertTrue(any(p.get("message", "").startswith("restoring from checkpoint") for p in seen), seen)
        self.assertEqual(sb.run("echo $kept").stdout, "yes\n")
        # A fork of many reports how many are made; an error ends the
        # stream as the typed error.
        made = []
        with sb.fork(n=3, progress=made.append) as forks:
            self.assertEqual(len(forks), 3)
        self.assertEqual(made[-1].get("done"), 3)
        self.assertEqual(made[-1].get("total"), 3)
        with self.assertRaises(molt.NotFound):
            self.client.hibernate("no-such-sandbox", progress=seen.append)


class Portable(LiveTest):
    def test_commit_export_import(self):
        """A sandbox's files become an image; a full checkpoint goes out
        as a bundle and comes back in as a new checkpoint whose fork has
        the file, the session's variable and its cwd; a bundle with a
        flipped byte is refused."""
        import tempfile

        sb = self.sandbox()
        sb.run("mkdir -p /srv && echo committed > /srv/mark && cd /srv && export STEP=2")
        img = sb.commit(uniq("img"))
        self.addCleanup(self.client.remove_image, img.name)
        with self.client.sandbox(image=img.name) as made:
            self.assertEqual(made.run("cat /srv/mark").stdout, "committed\n")

        ck = sb.checkpoint("portable", kind="full", wait=True)
        d = tempfile.mkdtemp()
        path = os.path.join(d, "ck.molt")
        n = self.client.export_checkpoint(ck, path)
        self.assertEqual(n, os.path.getsize(path))
        seen = []
        imp = self.client.import_checkpoint(path, progress=seen.append)
        self.assertNotEqual(imp.checkpoint.id, ck.id)
        self.assertEqual(imp.checkpoint.imported_from, ck.id)
        self.assertTrue(any(p.get("message") == "validating the CRIU images" for p in seen), seen)
        res = self.client.fork_checkpoint(imp.checkpoint.id)
        f = self.client.attach(res.sandboxes[0].id)
        self.addCleanup(f.remove)
        self.assertEqual(f.run("echo $STEP; pwd; cat mark").stdout, "2\n/srv\ncommitted\n")

        with open(path, "rb") as fh:
            b = bytearray(fh.read())
        b[len(b) // 2] ^= 1
        bad = os.path.join(d, "bad.molt")
        with open(bad, "wb") as fh:
            fh.write(b)
        with self.assertRaises(molt.InvalidArgument):
            self.client.import_checkpoint(bad)


class Turns(LiveTest):
    def test_turns_effects_llm(self):
        sb = self.sandbox()
        sb.run("echo x > /turnfile")
        t = sb.end_turn(label="t1")
        self.assertIn(t.decision, ("fs", "full"))
        self.assertTrue(t.checkpoint)
        turns = sb.turns()
        self.assertGreaterEqual(len(turns), 1)
        self.assertEqual(turns[-1].turn, t.turn)
        self.assertTrue(any("turnfile" in c.get("command", "") for c in turns[-1].commands or []))
        auto = sb.checkpoint(kind="auto", label="t2")
        self.assertIsInstance(auto, molt.TurnResult)
        self.assertEqual(auto.turn, t.turn + 1)
        rec = sb.recover(dry_run=True)
        self.assertTrue(rec.dry_run)
        self.assertIn(rec.checkpoint, (t.checkpoint, auto.checkpoint))

        e = sb.declare_effect(method="POST", url="https://pay.example/charge", type="payment",
                              body=b"{}", depends_on=[])
        self.assertTrue(e.declared)
        self.assertEqual(e.type, "payment")
        self.assertIn(e.id, [x.id for x in sb.effects()])
        self.assertEqual(self.client.consume_effect(e.id, "billing").consumers[0].by, "billing")
        comp = self.client.set_compensator(e.id, {"method": "POST", "url": "https://pay.example/refund",
                                                  "body": b'{"charge": 1}'})
        self.assertEqual(comp.compensator.url, "https://pay.example/refund")
        # With a compensator, a rollback past the consumed effect plans to
        # compensate it (a dry run: nothing is sent).
        plan = sb.rollback(t.checkpoint, dry_run=True).plan
        self.assertIn(e.id, plan.compensate or [])

        ep = sb.set_llm("http://127.0.0.1:9", gate="exec")
        self.assertTrue(ep.token)
        self.assertIn("/t/" + ep.token, ep.url)
        self.assertNotIn(ep.token, sb.llm().url)
        with self.assertRaises(molt.InvalidArgument):
            sb.set_llm("http://127.0.0.1:9", listen="0.0.0.0:0")
        sb.remove_llm()
        with self.assertRaises(molt.NotFound):
            sb.llm()
        self.assertEqual(sb.recovery().state, "none")


class Errors(LiveTest):
    def test_typed_errors(self):
        with self.assertRaises(molt.NotFound) as cm:
            self.client.inspect_sandbox("no-such-sandbox")
        self.assertEqual((cm.exception.kind, cm.exception.status), ("not_found", 404))
        self.assertTrue(cm.exception.message)
        with self.assertRaises(molt.NotFound):
            self.client.exec("no-such-sandbox", ["true"])
        with self.assertRaises(molt.InvalidArgument) as cm:
            self.client.sandbox(image=IMAGE, name="-not a name")
        self.assertEqual(cm.exception.status, 400)
        with self.assertRaises(molt.NotFound):
            self.client.sandbox(image="no-such-image")
        sb = self.sandbox()
        with self.assertRaises(molt.InvalidArgument):
            sb.fork(n=0)  # an explicit 0 is refused, never read as one
        with self.assertRaises(molt.InvalidArgument):
            sb.exec(["true"], env={"BAD=NAME": "x"})
        with self.assertRaises(molt.MethodNotAllowed):
            self.client._t.call("PUT", "/v1/host")


class Readme(LiveTest):
    def test_readme_example_runs(self):
        """The README's agent example runs as written and prints what its
        comments say."""
        import contextlib
        import io
        import re

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
        with open(path) as f:
            code = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
        lines = out.getvalue().splitlines()
        self.assertTrue(lines[0].startswith("exit 2"), lines)
        self.assertEqual(lines[1:3], ["1", "clean"])
        self.assertEqual([ln.split()[1:] for ln in lines[-2:]], [["0", "0"], ["1", "0"]])

    def test_root_readme_quick_start_runs(self):
        """The project README's Python quick start runs as written."""
        import contextlib
        import io
        import re

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        with open(os.path.join(root, "README.md")) as f:
            text = f.read()
        code = re.search(r"```python\n(.*?)```", text[text.index("## From code"):], re.S).group(1)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
        self.assertEqual(out.getvalue().split("\n\n")[0], "1\nclean", out.getvalue())
        self.assertEqual(out.getvalue().split(), ["1", "clean", "0", "1"])


ENDPOINT = os.environ.get("MOLT_TEST_ENDPOINT", "")
TLS_CA = os.environ.get("MOLT_TEST_TLS_CA", "")


class Remote(LiveTest):
    def test_tenant_token_over_tls(self):
        if not ENDPOINT:
            self.fail("the harness gave no TLS endpoint (MOLT_TEST_ENDPOINT)")
        tenant = uniq("t")
        self.client.create_tenant(tenant)
        self.addCleanup(self.client.delete_tenant, tenant)
        tok = self.client.create_token(tenant, note="python sdk test")
        self.assertTrue(tok.token)
        remote = molt.Client(endpoint=ENDPOINT, token=tok.token, tls_ca=TLS_CA)
        # Creating a sandbox is the host admin's (the admin scope); the
        # tenant's token works in it.
        with self.assertRaises(molt.PermissionDenied):
            remote.sandbox(image=IMAGE)
        made = self.client.sandbox(image=IMAGE, tenant=tenant)
        self.addCleanup(made.remove)
        sb = remote.attach(made.id)
        self.assertEqual(sb.info.tenant, tenant)
        # The exec stream's upgrade over TLS.
        r = sb.exec(["sh", "-c", "echo over tls; exit 4"])
        self.assertEqual((r.exit_code, r.stdout), (4, b"over tls\n"))
        self.assertEqual(sb.run("echo hi").stdout, "hi\n")
        self.assertEqual([s.id for s in remote.sandboxes()], [sb.id])
        with self.assertRaises(molt.Unauthenticated):
            molt.Client(endpoint=ENDPOINT, token="not-a-token", tls_ca=TLS_CA).sandboxes()
        with self.assertRaises(molt.PermissionDenied):
            remote.tenants()
        with self.assertRaises(molt.ConnectionFailed):
            # The system's roots do not trust the test's certificate.
            molt.Client(endpoint=ENDPOINT, token=tok.token).sandboxes()


if __name__ == "__main__":
    unittest.main()
