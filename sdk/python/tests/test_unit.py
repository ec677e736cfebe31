"""Tests of the SDK that need no daemon: the exec framing, the error
mapping, the models."""

import io
import struct
import unittest

import molt
from molt.errors import error_from_body
from molt.exec import MAX_FRAME, encode_frame, read_frame


class Framing(unittest.TestCase):
    def test_round_trip(self):
        buf = io.BytesIO(encode_frame(b"o", b"hello") + encode_frame(b"x", b'{"exit_code":3}'))
        self.assertEqual(read_frame(buf), (b"o", b"hello"))
        self.assertEqual(read_frame(buf), (b"x", b'{"exit_code":3}'))
        with self.assertRaises(EOFError):
            read_frame(buf)

    def test_oversized_length_refused_before_reading(self):
        buf = io.BytesIO(b"o" + struct.pack(">I", MAX_FRAME + 1) + b"x" * 10)
        with self.assertRaises(molt.StreamError):
            read_frame(buf)

    def test_truncated(self):
        with self.assertRaises(molt.StreamError):
            read_frame(io.BytesIO(b"o" + struct.pack(">I", 100) + b"short"))
        with self.assertRaises(molt.StreamError):
            read_frame(io.BytesIO(b"o\x00"))

    def test_encode_refuses_oversized(self):
        with self.assertRaises(ValueError):
            encode_frame(b"i", b"\0" * (MAX_FRAME + 1))


class Errors(unittest.TestCase):
    def test_kinds(self):
        cases = {
            "not_found": molt.NotFound, "already_exists": molt.AlreadyExists,
            "invalid_argument": molt.InvalidArgument, "method_not_allowed": molt.InvalidArgument,
            "failed_precondition": molt.FailedPrecondition, "unavailable": molt.Unavailable,
            "not_supported": molt.NotSupported, "resource_exhausted": molt.ResourceExhausted,
            "conflict": molt.Conflict, "unauthenticated": molt.Unauthenticated,
            "permission_denied": molt.PermissionDenied, "internal": molt.Internal,
        }
        for kind, cls in cases.items():
            e = error_from_body(400, ('{"kind":"%s","message":"m"}' % kind).encode())
            self.assertIsInstance(e, cls, kind)
            self.assertIsInstance(e, molt.MoltError)
            self.assertEqual((e.kind, e.message, e.status), (kind, "m", 400))

    def test_candidates_and_unknown_kind(self):
        e = error_from_body(400, b'{"kind":"invalid_argument","message":"ambiguous","candidates":["a:x","b:x"]}')
        self.assertEqual(e.candidates, ["a:x", "b:x"])
        e = error_from_body(418, b'{"kind":"newer_kind","message":"m"}')
        self.assertEqual(type(e), molt.MoltError)
        self.assertEqual(e.kind, "newer_kind")

    def test_not_an_error_body(self):
        e = error_from_body(502, b"<html>bad gateway</html>", "Bad Gateway")
        self.assertIsInstance(e, molt.Internal)
        self.assertIn("502", e.message)
        self.assertIn("bad gateway", e.message)


class Models(unittest.TestCase):
    def test_attributes(self):
        ck = molt.Checkpoint({"id": "c1", "kind": "fs", "stall_parts": {"criu_ms": 1.5}, "new_field": 1})
        self.assertEqual(ck.id, "c1")
        self.assertIsNone(ck.pending)  # known, left out by omitempty
        self.assertEqual(ck.stall_parts.criu_ms, 1.5)
        self.assertEqual(ck["new_field"], 1)
        with self.assertRaises(AttributeError):
            ck.no_such_field

    def test_nested(self):
        fr = molt.ForkResult({"sandboxes": [{"id": "s1", "sessions": [{"name": "main"}]}]})
        self.assertIsInstance(fr.sandboxes[0], molt.SandboxInfo)
        self.assertIsInstance(fr.sandboxes[0].sessions[0], molt.Session)

    def test_tree(self):
        cks = [{"id": "a"}, {"id": "b", "parent": "a"}, {"id": "c", "parent": "a"},
               {"id": "d", "parent": "b"}, {"id": "e", "parent": "gone"}]
        roots = molt.checkpoint_tree(cks)
        self.assertEqual([r.id for r in roots], ["a", "e"])
        self.assertEqual([c.id for c in roots[0].children], ["b", "c"])
        self.assertEqual([c.id for c in roots[0].children[0].children], ["d"])


class Transport(unittest.TestCase):
    def test_unreachable_socket(self):
        with self.assertRaises(molt.ConnectionFailed) as cm:
            molt.Client("/nonexistent/molt.sock").host()
        self.assertIn("/nonexistent/molt.sock", str(cm.exception))

    def test_endpoint_must_be_https(self):
        with self.assertRaises(ValueError):
            molt.Client(endpoint="http://127.0.0.1:1")

    def test_env(self):
        import os
        from unittest import mock

        with mock.patch.dict(os.environ, {"MOLT_SOCKET": "/x/y.sock", "MOLT_ENDPOINT": ""}):
            self.assertEqual(molt.Client().address, "/x/y.sock")


class FakeDaemon(unittest.TestCase):
    """The client's HTTP and exec framing against a scripted server on a
    unix socket (the live tests run the real daemon)."""

    def setUp(self):
        import json
        import os
        import socketserver
        import tempfile
        import threading

        self.dir = tempfile.mkdtemp()
        self.sock = os.path.join(self.dir, "s.sock")
        seen = self.seen = []

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline().decode()
                headers = {}
                while True:
                    h = self.rfile.readline().decode().strip()
                    if not h:
                        break
                    k, v = h.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
                body = self.rfile.read(int(headers.get("content-length", "0")))
                method, path, _ = line.split()
                seen.append((method, path, headers, body))
                if path == "/v1/host":
                    return self.answer(200, {"version": "v", "pool": {"loop": True}})
                if path in ("/v1/sandboxes/sb1/hibernate?offload=true", "/v1/sandboxes/sb1/offload"):
                    return self.answer(200, {"id": "sb1", "state": "hibernated", "offloaded": True})
                if path.startswith("/v1/sandboxes/missing"):
                    return self.answer(404, {"kind": "not_found", "message": "sandbox missing: not found"})
                if path.endswith("/exec") and headers.get("upgrade") == "molt-exec/1":
                    req = json.loads(body)
                    self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                                     b"Upgrade: molt-exec/1\r\n\r\n")
                    out = encode_frame(b"p", b"7") + encode_frame(b"o", b"a" * 100000)
                    if req.get("stdin"):
                        typ, data = read_frame(self.rfile)
                        assert typ == b"i", typ
                        assert read_frame(self.rfile)[0] == b"I"
                        out += encode_frame(b"o", data)
                    out += encode_frame(b"e", b"err") + encode_frame(b"x", b'{"exit_code":3,"signal":""}')
                    self.wfile.write(out)
                    return
                self.answer(500, "plain text")

            def answer(self, status, obj):
                data = (json.dumps(obj) if not isinstance(obj, str) else obj).encode()
                self.wfile.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(data)) + data)

        self.server = socketserver.ThreadingUnixStreamServer(self.sock, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.client = molt.Client(self.sock, timeout=10)

    def tearDown(self):
        import shutil

        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir)

    def test_call_and_error(self):
        h = self.client.host()
        self.assertEqual((h.version, h.pool.loop), ("v", True))
        with self.assertRaises(molt.NotFound) as cm:
            self.client.inspect_sandbox("missing")
        self.assertEqual((cm.exception.status, cm.exception.message), (404, "sandbox missing: not found"))
        with self.assertRaises(molt.Internal):
            self.client.sandboxes()

    def test_hibernate_offload(self):
        self.assertTrue(self.client.hibernate("sb1", offload=True).offloaded)
        self.assertEqual(self.seen[-1][:2], ("POST", "/v1/sandboxes/sb1/hibernate?offload=true"))
        self.assertTrue(self.client.offload("sb1").offloaded)
        self.assertEqual(self.seen[-1][:2], ("POST", "/v1/sandboxes/sb1/offload"))

    def test_exec(self):
        r = self.client.exec("sb1", ["cat"], stdin=b"typed", env={"A": "1"}, timeout=1.5)
        self.assertEqual((r.exit_code, r.pid, r.stderr), (3, 7, b"err"))
        self.assertEqual(r.stdout, b"a" * 100000 + b"typed")
        method, path, headers, body = self.seen[-1]
        self.assertEqual((method, path, headers["connection"]), ("POST", "/v1/sandboxes/sb1/exec", "Upgrade"))
        import json

        self.assertEqual(json.loads(body), {"args": ["cat"], "env": {"A": "1"}, "timeout_ms": 1500, "stdin": True})
        with self.assertRaises(molt.NotFound):
            self.client.exec("missing", ["true"])


if __name__ == "__main__":
    unittest.main()
