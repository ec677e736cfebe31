"""HTTP/1.1 to the daemon, over its unix socket or a TLS endpoint.

Standard library only: http.client with a unix-socket connection, and a
raw socket for the exec stream's upgrade. Each request opens its own
connection, so a Client is safe to share between threads.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import urllib.parse
from typing import Any, BinaryIO, Callable, Dict, Iterator, Optional, Tuple

from .errors import ConnectionFailed, Internal, MoltError, error_from_body

DEFAULT_SOCKET = "/run/molt/molt.sock"

# Bounds what is read of an error body or a JSON answer line, so a broken
# peer cannot make the client hold without limit.
_MAX_ERROR_BODY = 1 << 20
_MAX_LINE = 4 << 20


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("molt", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class Transport:
    """Where the daemon is and how to reach it (see :class:`molt.Client`)."""

    def __init__(self, socket_path: Optional[str] = None, endpoint: Optional[str] = None,
                 token: Optional[str] = None, tls_ca: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        self.endpoint = endpoint if endpoint is not None else os.environ.get("MOLT_ENDPOINT", "")
        self.token = token if token is not None else os.environ.get("MOLT_TOKEN", "")
        self.tls_ca = tls_ca if tls_ca is not None else os.environ.get("MOLT_TLS_CA", "")
        self.socket_path = socket_path or os.environ.get("MOLT_SOCKET", "") or DEFAULT_SOCKET
        self.timeout = timeout
        self._host = "molt"
        self._port = 0
        self._ssl: Optional[ssl.SSLContext] = None
        if self.endpoint:
            u = urllib.parse.urlsplit(self.endpoint)
            if u.scheme != "https" or not u.hostname:
                raise ValueError(f"endpoint {self.endpoint!r}: want https://HOST:PORT")
            self._host = u.hostname
            self._port = u.port or 443
            ctx = ssl.create_default_context(cafile=self.tls_ca or None)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            self._ssl = ctx

    def where(self) -> str:
        """The daemon's address, for messages."""
        return self.endpoint or self.socket_path

    def _connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._ssl is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return _UnixConnection(self.socket_path, timeout)

    def _headers(self, has_body: bool, stream: bool = False) -> Dict[str, str]:
        h = {"Accept": "application/x-ndjson, application/json" if stream else "application/json"}
        if has_body:
            h["Content-Type"] = "application/json"
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        return h

    def _connect_error(self, err: BaseException) -> ConnectionFailed:
        hint = "" if self.endpoint else " (is `molt daemon` running?)"
        return ConnectionFailed(f"connect to molt daemon at {self.where()}{hint}: {err}")

    def open(self, method: str, path: str, body: Any = None,
             timeout: Optional[float] = None, stream: bool = False,
             upload: Optional[BinaryIO] = None,
             content_type: str = "") -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends a request; returns the connection and its 2xx response
        (the caller reads and closes both), or raises the typed error.
        ``upload``, a binary file, is sent as the body (chunked) with
        ``content_type`` instead of ``body`` as JSON."""
        data: Any = None if body is None else json.dumps(body).encode()
        conn = self._connection(self.timeout if timeout is None else timeout)
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as e:
            conn.close()
            raise self._connect_error(e) from e
        try:
            headers = self._headers(data is not None, stream)
            if upload is not None:
                data = upload
                headers["Content-Type"] = content_type
                headers["Transfer-Encoding"] = "chunked"
            conn.request(method, path, body=data, headers=headers, encode_chunked=upload is not None)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise ConnectionFailed(f"{method} {path}: {e}") from e
        if resp.status // 100 != 2:
            try:
                raw = resp.read(_MAX_ERROR_BODY)
            except (OSError, http.client.HTTPException):
                raw = b""
            finally:
                conn.close()
            raise error_from_body(resp.status, raw, resp.reason)
        return conn, resp

    def call(self, method: str, path: str, body: Any = None,
             progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
             upload: Optional[BinaryIO] = None, content_type: str = "") -> Any:
        """Sends a request and returns its decoded JSON answer (None for an
        empty body).

        With ``progress``, the daemon is asked to stream the answer
        (docs/api.md, "Progress"): each report (``message``, and ``done``,
        ``total``, ``unit`` when measured) goes to ``progress`` as it
        comes, and the answer or the error is as without it."""
        if progress is not None:
            return self._streamed(method, path, body, progress, upload, content_type)
        conn, resp = self.open(method, path, body, timeout=None,
                               upload=upload, content_type=content_type)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"{method} {path}: {e}") from e
        finally:
            conn.close()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise Internal(f"{method} {path}: decode response: {e}") from e

    def _streamed(self, method: str, path: str, body: Any,
                  progress: Callable[[Dict[str, Any]], Any],
                  upload: Optional[BinaryIO] = None, content_type: str = "") -> Any:
        conn, resp = self.open(method, path, body, timeout=None, stream=True,
                               upload=upload, content_type=content_type)
        try:
            if "application/x-ndjson" not in (resp.getheader("Content-Type") or ""):
                raw = resp.read()  # a route that does not stream: its plain answer
                try:
                    return json.loads(raw) if raw.strip() else None
                except ValueError as e:
                    raise Internal(f"{method} {path}: decode response: {e}") from e
            while True:
                line = resp.readline(_MAX_LINE + 1)
                if not line:
                    raise ConnectionFailed(f"{method} {path}: the daemon closed the stream without an answer")
                if len(line) > _MAX_LINE:
                    raise Internal(f"{method} {path}: a line over {_MAX_LINE} bytes")
                if not line.strip():
                    continue
                try:
                    p = json.loads(line)
                except ValueError as e:
                    raise Internal(f"{method} {path}: decode progress: {e}") from e
                if p.get("error"):
                    raise error_from_body(p.get("status") or 200, json.dumps(p["error"]).encode())
                if "result" in p:
                    return p["result"]
                progress(p)
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"{method} {path}: {e}") from e
        finally:
            conn.close()

    def raw(self, method: str, path: str) -> bytes:
        """Sends a request and returns its body as bytes."""
        conn, resp = self.open(method, path)
        try:
            return resp.read()
        finally:
            conn.close()

    def lines(self, method: str, path: str, body: Any = None) -> Iterator[Dict[str, Any]]:
        """Sends a request whose answer is NDJSON and yields each line's
        object as it arrives."""
        conn, resp = self.open(method, path, body, timeout=None)
        try:
            while True:
                line = resp.readline(_MAX_LINE + 1)
                if not line:
                    return
                if len(line) > _MAX_LINE:
                    raise Internal(f"{method} {path}: a line over {_MAX_LINE} bytes")
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError as e:
                    raise Internal(f"{method} {path}: decode progress: {e}") from e
        finally:
            conn.close()

    def upgrade(self, path: str, body: Any, protocol: str) -> Tuple[socket.socket, BinaryIO]:
        """Sends a POST asking to upgrade to ``protocol`` and returns the
        socket and its buffered reader once the daemon answers 101; raises
        the typed error the daemon sent instead."""
        data = json.dumps(body).encode()
        try:
            if self._ssl is not None:
                raw = socket.create_connection((self._host, self._port), timeout=self.timeout)
                sock = self._ssl.wrap_socket(raw, server_hostname=self._host)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
        except (OSError, ssl.SSLError) as e:
            raise self._connect_error(e) from e
        try:
            head = [f"POST {path} HTTP/1.1", f"Host: {self._host}",
                    "Content-Type: application/json", "Connection: Upgrade",
                    f"Upgrade: {protocol}", f"Content-Length: {len(data)}"]
            if self.token:
                head.append("Authorization: Bearer " + self.token)
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
            rfile = sock.makefile("rb")
            status_line = rfile.readline(65537).decode("iso-8859-1")
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                raise ConnectionFailed(f"POST {path}: malformed status line {status_line!r}")
            status = int(parts[1])
            headers = http.client.parse_headers(rfile)
            if status == 101:
                # The stream has no deadline: a command runs as long as it
                # runs (its own timeout_ms bounds it).
                sock.settimeout(None)
                return sock, rfile
            raw_body = _read_body(rfile, headers)
            raise error_from_body(status, raw_body, parts[2].strip() if len(parts) > 2 else "")
        except MoltError:
            sock.close()
            raise
        except (OSError, ValueError, http.client.HTTPException) as e:
            sock.close()
            raise ConnectionFailed(f"POST {path}: {e}") from e


def _read_body(rfile: BinaryIO, headers: Any) -> bytes:
    """Reads an error answer's body (Content-Length, chunked or to EOF),
    at most _MAX_ERROR_BODY bytes."""
    if headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while len(out) < _MAX_ERROR_BODY:
            size = int(rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            out += rfile.read(min(size, _MAX_ERROR_BODY - len(out)))
            rfile.readline(1024)
        return bytes(out)
    n = headers.get("Content-Length")
    if n is not None:
        return rfile.read(min(int(n), _MAX_ERROR_BODY))
    return rfile.read(_MAX_ERROR_BODY)
