"""The client of molt's REST API (docs/api.md)."""

from __future__ import annotations

import http.client
import urllib.parse
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import models as m
from ._http import DEFAULT_SOCKET, Transport
from .errors import CommandFailed, CompensationFailed, Internal, StreamError, error_from_body
from .exec import UPGRADE_PROTOCOL, ExecResult, ExecStream, OutputChunk, Stdin

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = ["Client", "DEFAULT_SOCKET"]

Ref = Union[str, Mapping[str, Any], Any]

#: A receiver of a long call's progress (``progress=``): called with each
#: report as a dict, ``message`` and, when the stage is measured, ``done``,
#: ``total`` (absent when unknown) and ``unit`` (``"bytes"``, or absent for
#: a count). Reports are advisory; the call returns or raises as without.
Progress = Callable[[Dict[str, Any]], Any]


def _esc(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _ref(x: Ref) -> str:
    """A reference from a string, a model or a Sandbox handle (its id)."""
    if isinstance(x, str):
        if not x:
            raise ValueError("empty reference")
        return x
    if isinstance(x, Mapping) and "id" in x:
        return str(x["id"])
    ident = getattr(x, "id", None)
    if isinstance(ident, str) and ident:
        return ident
    raise TypeError(f"want a reference (ID, name, label) or an object with an id, got {type(x).__name__}")


def _ms(seconds: Optional[float]) -> Optional[int]:
    if seconds is None:
        return None
    if seconds < 0:
        raise ValueError("a timeout is not negative")
    return int(round(seconds * 1000))


def _body(**kw: Any) -> Dict[str, Any]:
    """A request body without the members left None (the daemon's
    defaults apply to those)."""
    return {k: v for k, v in kw.items() if v is not None}


class Client:
    """One molt daemon.

    By default the client talks to the daemon's unix socket
    (``$MOLT_SOCKET``, else ``/run/molt/molt.sock``). With ``endpoint``
    (``"https://HOST:PORT"``, or ``$MOLT_ENDPOINT``) it reaches a daemon's
    TLS listener instead, with a tenant's ``token`` (``$MOLT_TOKEN``) and
    the CA that signed its certificate (``tls_ca``, a PEM file, or
    ``$MOLT_TLS_CA``; default the system's roots).

    ``timeout`` (seconds) bounds each request's connect and reads; the
    default None waits as long as the daemon works (a full checkpoint or
    an image build can take a while). Exec streams have no deadline: give
    a command its own ``timeout``.

    Methods take references as the API does: a sandbox ID, unique ID
    prefix or name; a checkpoint ID, prefix, label or ``SANDBOX:LABEL``;
    or any object returned here (its ``id`` is used). Failures raise the
    typed errors of :mod:`molt.errors`.

    The client holds no connection between calls, so it is safe to share
    between threads; ``with molt.Client() as c:`` is allowed for symmetry
    and :meth:`close` does nothing harmful.
    """

    def __init__(self, socket: Optional[str] = None, *, endpoint: Optional[str] = None,
                 token: Optional[str] = None, tls_ca: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        self._t = Transport(socket, endpoint, token, tls_ca, timeout)

    @property
    def address(self) -> str:
        """The socket path or endpoint this client talks to."""
        return self._t.where()

    def close(self) -> None:
        """Releases the client (it holds no connection between calls)."""

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- host and images ----------------------------------------------------

    def host(self) -> m.HostInfo:
        """Reports the host, its pool and its features (with the reason
        for each unsupported one)."""
        return m.HostInfo(self._t.call("GET", "/v1/host"))

    def metrics(self) -> str:
        """The daemon's Prometheus metrics, as text."""
        return self._t.raw("GET", "/v1/metrics").decode("utf-8", "replace")

    def images(self) -> List[m.Image]:
        """Lists the images."""
        return [m.Image(x) for x in self._t.call("GET", "/v1/images") or []]

    def image(self, name: str) -> m.Image:
        """Returns one image."""
        return m.Image(self._t.call("GET", "/v1/images/" + _esc(name)))

    def build_image(self, name: str, *, suite: Optional[str] = None,
                    packages: Optional[Sequence[str]] = None, mirror: Optional[str] = None,
                    force: bool = False, progress: Optional[Callable[[str], Any]] = None) -> m.Image:
        """Builds a Debian image with debootstrap (cached by the daemon).

        The daemon streams its progress; each message goes to ``progress``
        as it arrives. Returns the image, or raises the error the stream
        ends with.
        """
        req = _body(name=name, suite=suite, packages=list(packages) if packages else None,
                    mirror=mirror, force=force or None)
        return self._image_stream("image build", "/v1/images/build", req, progress)

    def _image_stream(self, op: str, path: str, req: Any,
                      progress: Optional[Callable[[str], Any]]) -> m.Image:
        for p in self._t.lines("POST", path, req):
            if p.get("error"):
                e = p["error"]
                raise error_from_body(p.get("status") or 200, _json(e))
            if p.get("image"):
                return m.Image(p["image"])
            if progress is not None and p.get("message"):
                progress(p["message"])
        raise Internal(f"{op}: the daemon closed the stream without a result")

    def pull_image(self, ref: str, name: Optional[str] = None, *, insecure: bool = False,
                   force: bool = False, progress: Optional[Callable[[str], Any]] = None) -> m.Image:
        """Pulls an OCI or Docker image from a registry as ``name`` (by
        default the reference's last path part); the daemon reads the
        registry's credentials from its docker config file. ``insecure``
        talks plain HTTP. Progress lines go to ``progress``."""
        if name is None:
            name = ref.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
        req = _body(name=name, ref=ref, insecure=insecure or None, force=force or None)
        return self._image_stream("image pull", "/v1/images/pull", req, progress)

    def push_image(self, name: str, ref: str, *, insecure: bool = False,
                   progress: Optional[Callable[[str], Any]] = None) -> m.Image:
        """Pushes image ``name`` to a registry as ``ref`` (one layer of its
        tree, and its config); the answer carries the pushed digest."""
        req = _body(ref=ref, insecure=insecure or None)
        return self._image_stream("image push", f"/v1/images/{_esc(name)}/push", req, progress)

    def commit(self, ref: Ref, name: str) -> m.Image:
        """Makes image ``name`` of a sandbox's files (snapshotted with the
        sandbox frozen), keeping its image's config."""
        return m.Image(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/commit", {"name": name}))

    def import_image(self, name: str, path: str) -> m.Image:
        """Imports a directory or tarball at ``path`` on the daemon's host."""
        return m.Image(self._t.call("POST", "/v1/images/import", {"name": name, "path": path}))

    def remove_image(self, name: str) -> None:
        """Deletes an image."""
        self._t.call("DELETE", "/v1/images/" + _esc(name))

    # -- sandboxes ----------------------------------------------------------

    def create_sandbox(self, image: str = "debian", *, name: Optional[str] = None,
                       hostname: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                       secrets: Optional[Mapping[str, str]] = None,
                       resources: Optional[Mapping[str, int]] = None, seccomp: Optional[str] = None,
                       seccomp_profile: Optional[str] = None, network: Optional[str] = None,
                       egress: Optional[Mapping[str, Any]] = None, record_limit: Optional[int] = None,
                       effect_policy: Optional[Mapping[str, str]] = None,
                       tenant: Optional[str] = None, **extra: Any) -> "Sandbox":
        """Creates and starts a sandbox from ``image`` and returns its
        handle (a context manager that removes it at exit).

        The options are those of the create request (docs/api.md):
        ``resources`` (``memory_bytes``, ``pids``, ``cpu_millis``,
        ``io_weight``, ``standby_budget_bytes``, ``disk_bytes``: 0 the
        daemon's default, -1 none), ``env``, ``secrets`` (environment
        variables stored only sealed and never shown), ``seccomp``
        (``default``, ``unconfined``, ``custom``) or ``seccomp_profile``,
        ``network`` (``none`` or ``egress``) with an ``egress`` policy,
        ``record_limit``, ``effect_policy`` ({kind: ``refuse``,
        ``compensate`` or ``allow``}). ``extra`` members are sent as given
        (fields newer than this package).
        """
        from .sandbox import Sandbox

        req = _body(image=image, name=name, hostname=hostname, env=_opt(env), secrets=_opt(secrets),
                    resources=_opt(resources), seccomp=seccomp, seccomp_profile=seccomp_profile,
                    network=network, egress=_opt(egress), record_limit=record_limit,
                    effect_policy=_opt(effect_policy), tenant=tenant, **extra)
        info = m.SandboxInfo(self._t.call("POST", "/v1/sandboxes", req))
        return Sandbox._attach(self, info)

    sandbox = create_sandbox

    def attach(self, ref: Ref) -> "Sandbox":
        """Returns a handle on an existing sandbox (NotFound if there is
        none). Its context manager removes it at exit too."""
        from .sandbox import Sandbox

        return Sandbox._attach(self, self.inspect_sandbox(ref))

    def sandboxes(self) -> List[m.SandboxInfo]:
        """Lists the sandboxes."""
        return [m.SandboxInfo(x) for x in self._t.call("GET", "/v1/sandboxes") or []]

    def inspect_sandbox(self, ref: Ref) -> m.SandboxInfo:
        """Returns one sandbox with its live details (sessions, memory,
        processes, standbys)."""
        return m.SandboxInfo(self._t.call("GET", "/v1/sandboxes/" + _esc(_ref(ref))))

    def remove_sandbox(self, ref: Ref) -> None:
        """Deletes a sandbox: its processes, cgroup, root and checkpoints."""
        self._t.call("DELETE", "/v1/sandboxes/" + _esc(_ref(ref)))

    def stop(self, ref: Ref) -> m.SandboxInfo:
        """Kills a sandbox's processes; its files stay."""
        return m.SandboxInfo(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/stop"))

    def start(self, ref: Ref) -> m.SandboxInfo:
        """Starts a stopped or lost sandbox."""
        return m.SandboxInfo(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/start"))

    def hibernate(self, ref: Ref, *, offload: bool = False,
                  progress: Optional[Progress] = None) -> m.SandboxInfo:
        """Takes a full checkpoint of a sandbox and stops it (state
        ``hibernated``); :meth:`resume` restores it. With ``offload``, the
        checkpoint then goes to the daemon's object store and its local
        copy is freed (see :meth:`offload`). ``progress`` receives the
        daemon's reports as they come (see :data:`Progress`)."""
        q = "?offload=true" if offload else ""
        return m.SandboxInfo(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/hibernate{q}",
                                          progress=progress))

    def offload(self, ref: Ref, *, progress: Optional[Progress] = None) -> m.SandboxInfo:
        """Puts a hibernated sandbox's checkpoint into the daemon's object
        store (``molt daemon --store``) and frees its local copy
        (``offloaded``): :meth:`resume`, on this daemon or any other that
        shares the store, fetches it back."""
        return m.SandboxInfo(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/offload",
                                          progress=progress))

    def resume(self, ref: Ref, *, progress: Optional[Progress] = None) -> m.SandboxInfo:
        """Restores a hibernated sandbox from its hibernation checkpoint."""
        return m.SandboxInfo(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/resume",
                                          progress=progress))

    # -- exec and sessions ----------------------------------------------------

    def exec_stream(self, ref: Ref, args: Sequence[str], *, stdin: Stdin = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    user: Optional[str] = None, timeout: Optional[float] = None,
                    aside: bool = False) -> ExecStream:
        """Starts ``args`` in a sandbox and returns its :class:`ExecStream`:
        iterate it for the output as it comes, then read ``result``.

        ``stdin``: None gives the command /dev/null; bytes, str or a binary
        file are fed to it; True lets the caller write it
        (:meth:`ExecStream.write`). ``timeout`` (seconds) kills it (exit
        124). ``aside`` runs an operator's command, kept out of the turn
        log.
        """
        args = [str(a) for a in args]
        if not args:
            raise ValueError("exec: no command")
        req = _body(args=args, env=_opt(env), cwd=cwd, user=user, timeout_ms=_ms(timeout),
                    stdin=(stdin is not None and stdin is not False) or None, aside=aside or None)
        sock, rfile = self._t.upgrade(f"/v1/sandboxes/{_esc(_ref(ref))}/exec", req, UPGRADE_PROTOCOL)
        return ExecStream(sock, rfile, args, None if stdin is False else stdin)

    def exec(self, ref: Ref, args: Sequence[str], *, stdin: Union[None, bytes, str, Any] = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             user: Optional[str] = None, timeout: Optional[float] = None, aside: bool = False,
             check: bool = False, on_output: Optional[Callable[[OutputChunk], Any]] = None) -> ExecResult:
        """Runs ``args`` in a sandbox to its end and returns its
        :class:`ExecResult` (exit code, signal, timed_out, stdout and
        stderr). Each output chunk also goes to ``on_output`` as it
        arrives. With ``check`` a non-zero exit raises CommandFailed.
        Options as :meth:`exec_stream` (``stdin=True`` is not allowed
        here).
        """
        if stdin is True:
            raise ValueError("exec: stdin=True needs exec_stream")
        with self.exec_stream(ref, args, stdin=stdin, env=env, cwd=cwd, user=user,
                              timeout=timeout, aside=aside) as s:
            res = s.wait(on_output)
        return res.check() if check else res

    def exec_detached(self, ref: Ref, args: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
                      cwd: Optional[str] = None, user: Optional[str] = None,
                      timeout: Optional[float] = None, aside: bool = False) -> int:
        """Starts ``args`` in the background (output to /dev/null) and
        returns its PID inside the sandbox."""
        req = _body(args=[str(a) for a in args], env=_opt(env), cwd=cwd, user=user,
                    timeout_ms=_ms(timeout), detach=True, aside=aside or None)
        return int(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/exec", req)["pid"])

    def session_run(self, ref: Ref, session: str, command: str, *, timeout: Optional[float] = None,
                    aside: bool = False, check: bool = False) -> m.SessionResult:
        """Runs shell text in the persistent session ``session`` (made on
        first use): its working directory, variables and background jobs
        stay from one call to the next. Returns stdout, stderr and the exit
        code; with ``check`` a non-zero exit raises CommandFailed."""
        req = _body(command=command, timeout_ms=_ms(timeout), aside=aside or None)
        res = m.SessionResult(self._t.call(
            "POST", f"/v1/sandboxes/{_esc(_ref(ref))}/sessions/{_esc(session)}/run", req))
        if check and res.exit_code != 0:
            raise CommandFailed(f"session {session}: {command!r} exited {res.exit_code}: "
                                f"{(res.stderr or '').strip()[-500:]}", res)
        return res

    def session_close(self, ref: Ref, session: str) -> None:
        """Ends a session (its shell and what it started)."""
        self._t.call("DELETE", f"/v1/sandboxes/{_esc(_ref(ref))}/sessions/{_esc(session)}")

    # -- checkpoints, rollback, fork -----------------------------------------

    def checkpoint(self, ref: Ref, *, kind: Optional[str] = None, label: Optional[str] = None,
                   wait: bool = False, keep: bool = False,
                   progress: Optional[Progress] = None) -> Union[m.Checkpoint, m.TurnResult]:
        """Takes a checkpoint of a sandbox.

        ``kind``: ``"fs"`` (files only; the default), ``"full"`` (files,
        processes and memory, with CRIU) or ``"auto"`` (ends the turn with
        the checkpoint its effects need: returns a :class:`TurnResult`).
        A full checkpoint returns ``pending`` right after its instant is
        captured unless ``wait``; ``keep`` keeps a standby of it for a hot
        rollback. ``progress`` receives the daemon's reports (the bytes a
        waited-for full checkpoint stores).
        """
        req = _body(kind=kind, label=label, wait=wait or None, keep=keep or None)
        data = self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/checkpoints", req, progress=progress)
        return m.TurnResult(data) if kind == "auto" else m.Checkpoint(data)

    def checkpoints(self, ref: Ref) -> List[m.Checkpoint]:
        """Lists a sandbox's checkpoints, oldest first (``parent`` links
        form the tree)."""
        return [m.Checkpoint(x) for x in
                self._t.call("GET", f"/v1/sandboxes/{_esc(_ref(ref))}/checkpoints") or []]

    def export_checkpoint(self, ref: Ref, dest: Union[str, BinaryIO]) -> int:
        """Writes checkpoint ``ref`` as a portable bundle (docs/bundles.md)
        to ``dest``, a path or a binary file; returns the bytes written.
        An export cut short raises :class:`StreamError` (what was written
        is no bundle any import accepts)."""
        path = f"/v1/checkpoints/{_esc(_ref(ref))}/export"
        f = open(dest, "wb") if isinstance(dest, str) else dest
        n, tail = 0, b""
        try:
            conn, resp = self._t.open("GET", path, timeout=None)
            try:
                while True:
                    chunk = resp.read(1 << 20)
                    if not chunk:
                        break
                    f.write(chunk)
                    n += len(chunk)
                    tail = (tail + chunk)[-1024:]
            except (OSError, http.client.HTTPException) as e:
                raise StreamError(f"export {_ref(ref)}: {e}") from e
            finally:
                conn.close()
        finally:
            if isinstance(dest, str):
                f.close()
        if len(tail) < 1024 or tail.strip(b"\0"):
            # A tar stream ends with two zero blocks; the daemon names a
            # failure after its answer began only in a trailer.
            raise StreamError(f"export {_ref(ref)}: the bundle was cut short after {n} bytes")
        return n

    def import_checkpoint(self, src: Union[str, BinaryIO], *, tenant: Optional[str] = None,
                          progress: Optional[Progress] = None) -> m.Model:
        """Sends a bundle (a path or a binary file) to the daemon, which
        verifies it whole before listing its checkpoint (a new ID, the
        caller's tenant's, or ``tenant``'s for the host admin). Returns the
        import's report; its ``checkpoint`` forks with
        :meth:`fork_checkpoint`."""
        path = "/v1/checkpoints/import" + (f"?tenant={_esc(tenant)}" if tenant else "")
        f = open(src, "rb") if isinstance(src, str) else src
        try:
            return m.Model(self._t.call("POST", path, progress=progress, upload=f,
                                        content_type="application/x-tar"))
        finally:
            if isinstance(src, str):
                f.close()

    def checkpoint_tree(self, ref: Ref) -> List[m.Checkpoint]:
        """A sandbox's checkpoints as a tree: the roots, each checkpoint
        with its ``children``."""
        return m.checkpoint_tree(self.checkpoints(ref))

    def inspect_checkpoint(self, ref: Ref) -> m.Checkpoint:
        """Returns one checkpoint."""
        return m.Checkpoint(self._t.call("GET", "/v1/checkpoints/" + _esc(_ref(ref))))

    def delete_checkpoint(self, ref: Ref) -> None:
        """Deletes a checkpoint; its children are re-parented to its
        parent."""
        self._t.call("DELETE", "/v1/checkpoints/" + _esc(_ref(ref)))

    def verify_checkpoint(self, ref: Ref) -> m.Checkpoint:
        """Checks every stored object of a checkpoint against its
        manifest; FailedPrecondition names each missing, truncated or
        corrupted one."""
        return m.Checkpoint(self._t.call("POST", f"/v1/checkpoints/{_esc(_ref(ref))}/verify"))

    def verify_chain(self, ref: Ref) -> m.ChainVerification:
        """Verifies a checkpoint's lineage: each manifest up to the root
        signed by a trusted key and linked to its parent's digest."""
        return m.ChainVerification(self._t.call("GET", f"/v1/checkpoints/{_esc(_ref(ref))}/chain"))

    def rollback(self, ref: Ref, checkpoint: Ref, *, tier: Optional[str] = None,
                 force: bool = False, dry_run: bool = False) -> m.RollbackResult:
        """Returns a sandbox to a checkpoint: its files, and its processes
        when the checkpoint holds them.

        ``tier``: None for the fastest (hot when a standby is ready),
        ``"warm"`` or ``"cold"``. ``force`` rolls back past effects others
        consumed (else Conflict); ``dry_run`` only reports the plan.
        Raises CompensationFailed when the rollback happened but some
        compensation failed (the world still has those effects).
        """
        req = _body(checkpoint=_ref(checkpoint), tier=tier or None, force=force or None,
                    dry_run=dry_run or None)
        res = m.RollbackResult(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/rollback", req))
        comp = res.compensation
        if comp and comp.get("state") != "compensated":
            raise CompensationFailed(f"rollback to {res.checkpoint}: compensation {comp.get('state')}", res)
        return res

    def fork(self, ref: Ref, n: int = 1, *, checkpoint: Optional[Ref] = None,
             reseed: bool = False, progress: Optional[Progress] = None) -> m.ForkResult:
        """Makes ``n`` sandboxes (1..1000) from a sandbox: from
        ``checkpoint``, or from a new fs checkpoint of it. ``reseed`` gives
        the forks' sessions fresh ``$RANDOM`` seeds; ``progress`` receives
        how many are made so far."""
        req = _body(n=int(n), checkpoint=_ref(checkpoint) if checkpoint is not None else None,
                    reseed=reseed or None)
        return m.ForkResult(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/fork", req, progress=progress))

    def fork_checkpoint(self, checkpoint: Ref, n: int = 1, *, reseed: bool = False,
                        progress: Optional[Progress] = None) -> m.ForkResult:
        """Makes ``n`` sandboxes from a checkpoint."""
        req = _body(n=int(n), reseed=reseed or None)
        return m.ForkResult(self._t.call("POST", f"/v1/checkpoints/{_esc(_ref(checkpoint))}/fork", req,
                                         progress=progress))

    # -- turns, recovery, LLM endpoint ---------------------------------------

    def end_turn(self, ref: Ref, *, label: Optional[str] = None, ignore: Optional[Iterable[str]] = None,
                 dry_run: bool = False) -> m.TurnResult:
        """Ends the sandbox's current turn with the checkpoint its effects
        need (none, fs or full) and starts the next (docs/turns.md).
        ``ignore``: path patterns whose changes do not matter;
        ``dry_run`` decides without checkpointing."""
        req = _body(label=label, ignore=list(ignore) if ignore else None, dry_run=dry_run or None)
        return m.TurnResult(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/turn", req))

    def turns(self, ref: Ref) -> List[m.TurnRecord]:
        """The sandbox's turn log (redacted)."""
        return [m.TurnRecord(x) for x in self._t.call("GET", f"/v1/sandboxes/{_esc(_ref(ref))}/turns") or []]

    def recover(self, ref: Ref, *, to: Optional[Ref] = None, force: bool = False,
                dry_run: bool = False) -> m.RecoverResult:
        """Returns a sandbox to a committed turn checkpoint (``to``, default
        the latest whose turns are all recorded) and arms the fast-forward
        of its restarted agent (docs/recovery.md)."""
        req = _body(to=_ref(to) if to is not None else None, force=force or None, dry_run=dry_run or None)
        return m.RecoverResult(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/recover", req))

    def recovery(self, ref: Ref) -> m.RecoveryStatus:
        """Where a sandbox's fast-forward stands."""
        return m.RecoveryStatus(self._t.call("GET", f"/v1/sandboxes/{_esc(_ref(ref))}/recover"))

    def set_llm(self, ref: Ref, upstream: str, *, listen: Optional[str] = None, expose: bool = False,
                gate: Optional[str] = None, header: Optional[Mapping[str, str]] = None,
                ignore: Optional[Iterable[str]] = None) -> m.LLMEndpoint:
        """Gives a sandbox an LLM endpoint forwarding to ``upstream``; give
        the answer's ``url`` (which holds its token) to the agent as its
        LLM base URL. ``listen`` must be loopback unless ``expose``;
        ``gate`` is ``"response"`` or ``"exec"``; ``header`` is added to
        every forwarded call (the operator's API key)."""
        req = _body(upstream=upstream, listen=listen, expose=expose or None, gate=gate,
                    header=_opt(header), ignore=list(ignore) if ignore else None)
        return m.LLMEndpoint(self._t.call("PUT", f"/v1/sandboxes/{_esc(_ref(ref))}/llm", req))

    def llm(self, ref: Ref) -> m.LLMEndpoint:
        """A sandbox's LLM endpoint (its ``url`` without the token)."""
        return m.LLMEndpoint(self._t.call("GET", f"/v1/sandboxes/{_esc(_ref(ref))}/llm"))

    def remove_llm(self, ref: Ref) -> None:
        """Closes a sandbox's LLM endpoint."""
        self._t.call("DELETE", f"/v1/sandboxes/{_esc(_ref(ref))}/llm")

    # -- effects --------------------------------------------------------------

    def effects(self, ref: Ref, since: Optional[Ref] = None) -> List[m.Effect]:
        """A sandbox's effect ledger in order; with ``since`` (a
        checkpoint), only what was recorded after it."""
        p = f"/v1/sandboxes/{_esc(_ref(ref))}/effects"
        if since is not None:
            p += "?since=" + urllib.parse.quote(_ref(since), safe="")
        return [m.Effect(x) for x in self._t.call("GET", p) or []]

    def declare_effect(self, ref: Ref, *, kind: Optional[str] = None, state: Optional[str] = None,
                       method: Optional[str] = None, url: Optional[str] = None,
                       host: Optional[str] = None, body: Optional[bytes] = None,
                       idempotency_key: Optional[str] = None, status: Optional[int] = None,
                       response_body: Optional[bytes] = None,
                       compensator: Optional[Mapping[str, Any]] = None, type: Optional[str] = None,
                       depends_on: Optional[Sequence[str]] = None) -> m.Effect:
        """Records an effect that did not cross molt's proxy (an agent's
        own tool call). ``kind`` defaults to ``effect``, ``state`` to
        ``completed``; ``compensator`` is {``method``, ``url``, ``header``,
        ``body``} or {``sandbox``, ``command``}; ``depends_on`` None means
        every earlier effect, [] none."""
        req = _body(kind=kind, state=state, method=method, url=url, host=host, body=_b64(body),
                    idempotency_key=idempotency_key, status=status, response_body=_b64(response_body),
                    compensator=_compensator(compensator), type=type)
        req["depends_on"] = list(depends_on) if depends_on is not None else None
        return m.Effect(self._t.call("POST", f"/v1/sandboxes/{_esc(_ref(ref))}/effects", req))

    def consume_effect(self, effect: Ref, by: str, note: Optional[str] = None) -> m.Effect:
        """Marks an effect consumed (``by`` acted on it): a rollback that
        would orphan it without a compensator is then refused unless
        forced."""
        return m.Effect(self._t.call("POST", f"/v1/effects/{_esc(_ref(effect))}/consumers",
                                     _body(by=by, note=note)))

    def set_compensator(self, effect: Ref, compensator: Mapping[str, Any]) -> m.Effect:
        """Gives a recorded effect its compensator after the fact."""
        return m.Effect(self._t.call("POST", f"/v1/effects/{_esc(_ref(effect))}/compensator",
                                     _compensator(compensator)))

    # -- audit, tenants, tokens, keys (host admin) --------------------------

    def audit_export(self, since: int = 0) -> bytes:
        """The audit log's entries after seq ``since``, byte for byte as
        the log holds them (JSON lines)."""
        p = "/v1/audit" + (f"?since={int(since)}" if since else "")
        return self._t.raw("GET", p)

    def audit_verify(self) -> m.AuditVerifyResult:
        """Has the daemon verify its audit log against its anchor."""
        return m.AuditVerifyResult(self._t.call("POST", "/v1/audit/verify"))

    def create_tenant(self, name: str) -> m.Tenant:
        """Makes a tenant."""
        return m.Tenant(self._t.call("POST", "/v1/tenants", {"name": name}))

    def tenants(self) -> List[m.Tenant]:
        """Lists the tenants."""
        return [m.Tenant(x) for x in self._t.call("GET", "/v1/tenants") or []]

    def delete_tenant(self, name: str) -> None:
        """Deletes a tenant that owns nothing, with its tokens and keys."""
        self._t.call("DELETE", "/v1/tenants/" + _esc(name))

    def create_token(self, tenant: str, *, scopes: Optional[Sequence[str]] = None,
                     sandboxes: Optional[Sequence[str]] = None, note: Optional[str] = None) -> m.Token:
        """Makes an API token of a tenant; its ``token`` (the secret) is
        only in this answer."""
        req = _body(tenant=tenant, scopes=list(scopes) if scopes else None,
                    sandboxes=list(sandboxes) if sandboxes else None, note=note)
        return m.Token(self._t.call("POST", "/v1/tokens", req))

    def tokens(self, tenant: str = "") -> List[m.Token]:
        """Lists the tokens of a tenant ("" for all), without secrets."""
        return [m.Token(x) for x in
                self._t.call("GET", "/v1/tokens?tenant=" + urllib.parse.quote(tenant, safe="")) or []]

    def delete_token(self, ident: str) -> None:
        """Revokes a token."""
        self._t.call("DELETE", "/v1/tokens/" + _esc(ident))

    def data_keys(self) -> List[m.DataKey]:
        """Lists the tenants' data keys of encryption at rest."""
        return [m.DataKey(x) for x in self._t.call("GET", "/v1/keys") or []]

    def rotate_data_key(self, tenant: str = "") -> m.DataKey:
        """Gives a tenant a new current data key."""
        return m.DataKey(self._t.call("POST", "/v1/keys/rotate", {"tenant": tenant}))

    def shred_data_keys(self, tenant: str) -> m.ShredResult:
        """Deletes every data key of a tenant: what they sealed can never
        be read again."""
        return m.ShredResult(self._t.call("POST", "/v1/keys/shred", {"tenant": tenant}))


def _opt(x: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    return dict(x) if x else None


def _b64(b: Optional[bytes]) -> Optional[str]:
    # Go encodes []byte members as base64.
    if b is None:
        return None
    import base64

    if isinstance(b, str):
        b = b.encode()
    return base64.b64encode(b).decode()


def _compensator(c: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if c is None:
        return None
    out = dict(c)
    if isinstance(out.get("body"), (bytes, str)):
        out["body"] = _b64(out["body"])
    return out


def _json(obj: Any) -> bytes:
    import json

    return json.dumps(obj).encode()
