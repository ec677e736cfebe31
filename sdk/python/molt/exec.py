"""The exec stream (docs/api.md, "Exec stream").

After ``101 Switching Protocols`` both directions carry frames: one type
byte, a big-endian uint32 payload length (at most 4 MiB), the payload.
"""

from __future__ import annotations

import io
import json
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple, Optional, Union

from .errors import CommandFailed, StreamError

__all__ = ["OutputChunk", "ExecResult", "ExecStream", "UPGRADE_PROTOCOL", "MAX_FRAME",
           "read_frame", "encode_frame"]

UPGRADE_PROTOCOL = "molt-exec/1"
MAX_FRAME = 4 << 20

FRAME_STDIN = b"i"
FRAME_STDIN_CLOSE = b"I"
FRAME_SIGNAL = b"s"
FRAME_STARTED = b"p"
FRAME_STDOUT = b"o"
FRAME_STDERR = b"e"
FRAME_EXIT = b"x"
FRAME_ERROR = b"E"

# What a reader allocates for a frame before its bytes arrive: the buffer
# grows with the bytes read, never with the length the header claims.
_CHUNK = 64 << 10


def encode_frame(typ: bytes, payload: bytes = b"") -> bytes:
    """Returns one frame: ``typ`` (one byte), the length, the payload."""
    if len(typ) != 1:
        raise ValueError("a frame type is one byte")
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds limit {MAX_FRAME}")
    return typ + struct.pack(">I", len(payload)) + payload


def _read_full(r: BinaryIO, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        b = r.read(min(n - len(buf), _CHUNK))
        if not b:
            raise EOFError
        buf += b
    return bytes(buf)


def read_frame(r: BinaryIO) -> "tuple[bytes, bytes]":
    """Reads one frame from ``r`` and returns (type, payload).

    Raises EOFError at a clean end before a frame, StreamError for a
    truncated or oversized frame.
    """
    hdr = r.read(5)
    if not hdr:
        raise EOFError
    if len(hdr) < 5:
        try:
            hdr += _read_full(r, 5 - len(hdr))
        except EOFError:
            raise StreamError("exec stream: truncated frame header") from None
    (n,) = struct.unpack(">I", hdr[1:5])
    if n > MAX_FRAME:
        raise StreamError(f"exec stream: frame of {n} bytes exceeds limit {MAX_FRAME}")
    try:
        payload = _read_full(r, n)
    except EOFError:
        raise StreamError("exec stream: truncated frame") from None
    return hdr[:1], payload


class OutputChunk(NamedTuple):
    """A piece of a command's output: ``stream`` is ``"stdout"`` or
    ``"stderr"``, ``data`` the bytes as they came."""

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """The bytes decoded as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", "replace")


@dataclass
class ExecResult:
    """How a command ended.

    ``exit_code``: its exit status (128+N when killed by signal N, 124 at
    its timeout, 127 when not found); ``signal``: the signal that killed
    it, if one did; ``timed_out``; ``duration_ms``; ``replayed``: a
    recovery's fast-forward answered from the turn log; ``stdout`` and
    ``stderr``: the output, when it was collected; ``pid``: its PID in the
    sandbox.
    """

    exit_code: int
    signal: str = ""
    timed_out: bool = False
    duration_ms: float = 0.0
    replayed: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    pid: Optional[int] = None
    args: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the command exited 0."""
        return self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        """stderr decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")

    def check(self) -> "ExecResult":
        """Returns self if the command exited 0, else raises CommandFailed."""
        if self.exit_code != 0:
            raise CommandFailed(f"command {self.args!r} exited {self.exit_code}"
                                + (f" ({self.signal})" if self.signal else "")
                                + (": " + self.stderr_text.strip()[-500:] if self.stderr else ""), self)
        return self


Stdin = Union[None, bool, bytes, str, BinaryIO]


class ExecStream:
    """A running command: iterate it for its output, then read ``result``.

    ::

        with sb.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done"]) as p:
            for chunk in p:              # OutputChunk as the output arrives
                print(chunk.stream, chunk.text, end="")
        print(p.result.exit_code)

    With ``stdin=True`` the caller writes the command's input with
    :meth:`write` and ends it with :meth:`close_stdin`; :meth:`signal`
    sends a signal to the command's process group. Closing the stream
    before the command ends kills it.
    """

    def __init__(self, sock: socket.socket, rfile: BinaryIO, args: list, stdin: Stdin) -> None:
        self._sock = sock
        self._rfile = rfile
        self._wlock = threading.Lock()
        self._args = list(args)
        self._closed = False
        self._feeder: Optional[threading.Thread] = None
        self.pid: Optional[int] = None
        """The command's PID inside the sandbox, once the daemon sent it."""
        self.result: Optional[ExecResult] = None
        """The exit status, once the command ended (set by iteration or :meth:`wait`)."""
        if stdin is not None and stdin is not True and stdin is not False:
            src = stdin
            if isinstance(src, str):
                src = src.encode()
            if isinstance(src, (bytes, bytearray, memoryview)):
                src = io.BytesIO(bytes(src))
            self._feeder = threading.Thread(target=self._feed, args=(src,), daemon=True)
            self._feeder.start()

    def _send(self, typ: bytes, payload: bytes = b"") -> None:
        frame = encode_frame(typ, payload)
        with self._wlock:
            self._sock.sendall(frame)

    def _feed(self, src: BinaryIO) -> None:
        try:
            while True:
                b = src.read(_CHUNK)
                if not b:
                    break
                self._send(FRAME_STDIN, b)
            self._send(FRAME_STDIN_CLOSE)
        except OSError:
            pass  # the command ended or the stream closed; its status says how

    def write(self, data: Union[bytes, str]) -> None:
        """Sends ``data`` to the command's stdin (needs ``stdin=True``)."""
        if isinstance(data, str):
            data = data.encode()
        for off in range(0, len(data), _CHUNK):
            self._send(FRAME_STDIN, data[off:off + _CHUNK])

    def close_stdin(self) -> None:
        """Ends the command's stdin (it reads EOF)."""
        self._send(FRAME_STDIN_CLOSE)

    def signal(self, signum: int) -> None:
        """Sends signal ``signum`` to the command's process group."""
        self._send(FRAME_SIGNAL, str(int(signum)).encode())

    def __iter__(self) -> Iterator[OutputChunk]:
        while self.result is None:
            if self._closed:
                raise StreamError("exec stream: closed before the command's exit status")
            try:
                typ, payload = read_frame(self._rfile)
            except EOFError:
                self.close()
                raise StreamError("exec stream: ended before the command's exit status") from None
            except OSError as e:
                self.close()
                raise StreamError(f"exec stream: {e}") from e
            if typ == FRAME_STDOUT:
                yield OutputChunk("stdout", payload)
            elif typ == FRAME_STDERR:
                yield OutputChunk("stderr", payload)
            elif typ == FRAME_STARTED:
                try:
                    self.pid = int(payload.decode())
                except ValueError:
                    pass
            elif typ == FRAME_EXIT:
                self.close()
                try:
                    st = json.loads(payload)
                except ValueError as e:
                    raise StreamError(f"exec: decode exit status: {e}") from e
                self.result = ExecResult(
                    exit_code=int(st.get("exit_code", 0)), signal=st.get("signal") or "",
                    timed_out=bool(st.get("timed_out")), duration_ms=float(st.get("duration_ms") or 0),
                    replayed=bool(st.get("replayed")), pid=self.pid, args=self._args)
            elif typ == FRAME_ERROR:
                self.close()
                raise StreamError("exec: " + payload.decode("utf-8", "replace"))
            # Other frame types are newer than this client: skipped.

    def wait(self, on_output: Optional[Callable[[OutputChunk], Any]] = None) -> ExecResult:
        """Reads the stream to its end and returns the result, its stdout
        and stderr collected (each chunk also given to ``on_output``)."""
        out, err = bytearray(), bytearray()
        for chunk in self:
            (out if chunk.stream == "stdout" else err).extend(chunk.data)
            if on_output is not None:
                on_output(chunk)
        assert self.result is not None
        self.result.stdout, self.result.stderr = bytes(out), bytes(err)
        return self.result

    def close(self) -> None:
        """Closes the stream; a command still running is killed."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._rfile.close()
        self._sock.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
