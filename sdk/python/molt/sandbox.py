"""A handle on one sandbox."""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Union

from . import models as m
from .client import Client, Ref
from .errors import NotFound
from .exec import ExecResult, ExecStream, Stdin

__all__ = ["Sandbox", "Forks"]


class Sandbox:
    """A sandbox of a molt daemon, and every operation on it.

    ``molt.Sandbox(image="debian", ...)`` creates one (on the default
    daemon, or ``client=``); ``Client.sandbox(...)`` and
    ``Client.attach(ref)`` return one too. As a context manager it removes
    the sandbox at exit (its checkpoints go with it)::

        with molt.Sandbox(image="debian") as sb:
            sb.run("echo hello > /greeting")
            ck = sb.checkpoint(label="greeted")
            sb.run("rm /greeting")
            sb.rollback(ck)

    ``info`` is the sandbox as last reported (``refresh()`` reads it
    again); ``id`` and ``name`` are its identity.
    """

    def __init__(self, image: str = "debian", *, client: Optional[Client] = None,
                 **create: Any) -> None:
        own = client is None
        self.client: Client = client if client is not None else Client()
        self._own_client = own
        made = self.client.create_sandbox(image, **create)
        self.info: m.SandboxInfo = made.info
        self._removed = False

    @classmethod
    def _attach(cls, client: Client, info: m.SandboxInfo) -> "Sandbox":
        sb = cls.__new__(cls)
        sb.client = client
        sb._own_client = False
        sb.info = info
        sb._removed = False
        return sb

    @property
    def id(self) -> str:
        """The sandbox's ID."""
        return self.info["id"]

    @property
    def name(self) -> Optional[str]:
        """The sandbox's name, if it has one."""
        return self.info.get("name") or None

    @property
    def state(self) -> str:
        """The state as last reported (call :meth:`refresh` to read it again)."""
        return self.info.get("state", "")

    def __repr__(self) -> str:
        return f"<molt.Sandbox {self.id}{' ' + self.name if self.name else ''} {self.state}>"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- lifecycle ------------------------------------------------------------

    def refresh(self) -> m.SandboxInfo:
        """Inspects the sandbox again (with its live details) and returns it."""
        self.info = self.client.inspect_sandbox(self.id)
        return self.info

    inspect = refresh

    def remove(self) -> None:
        """Deletes the sandbox and its checkpoints; one already gone is
        not an error."""
        if self._removed:
            return
        try:
            self.client.remove_sandbox(self.id)
        except NotFound:
            pass
        self._removed = True
        if self._own_client:
            self.client.close()

    def stop(self) -> m.SandboxInfo:
        """Kills the sandbox's processes; its files stay."""
        self.info = self.client.stop(self.id)
        return self.info

    def start(self) -> m.SandboxInfo:
        """Starts the stopped sandbox again."""
        self.info = self.client.start(self.id)
        return self.info

    def hibernate(self, *, offload: bool = False, progress: Any = None) -> m.SandboxInfo:
        """Full checkpoint, then stop: the sandbox costs no memory until
        :meth:`resume`; with ``offload``, no local disk either (its
        checkpoint waits in the daemon's object store)."""
        self.info = self.client.hibernate(self.id, offload=offload, progress=progress)
        return self.info

    def resume(self, *, progress: Any = None) -> m.SandboxInfo:
        """Restores the hibernated sandbox, processes and all."""
        self.info = self.client.resume(self.id, progress=progress)
        return self.info

    # -- commands -------------------------------------------------------------

    def exec(self, args: Sequence[str], **kw: Any) -> ExecResult:
        """Runs ``args`` to its end; see :meth:`Client.exec` (``stdin``,
        ``env``, ``cwd``, ``user``, ``timeout``, ``check``,
        ``on_output``)."""
        return self.client.exec(self.id, args, **kw)

    def exec_stream(self, args: Sequence[str], *, stdin: Stdin = None, **kw: Any) -> ExecStream:
        """Starts ``args`` and returns its stream of output chunks; see
        :meth:`Client.exec_stream`."""
        return self.client.exec_stream(self.id, args, stdin=stdin, **kw)

    def exec_detached(self, args: Sequence[str], **kw: Any) -> int:
        """Starts ``args`` in the background; returns its PID."""
        return self.client.exec_detached(self.id, args, **kw)

    def run(self, command: str, *, session: str = "main", timeout: Optional[float] = None,
            aside: bool = False, check: bool = False) -> m.SessionResult:
        """Runs shell text in a persistent session (``"main"`` by default):
        ``cd``, variables and background jobs stay for the next call.
        Returns ``stdout``, ``stderr``, ``exit_code``; ``check`` raises
        CommandFailed on a non-zero exit."""
        return self.client.session_run(self.id, session, command, timeout=timeout, aside=aside,
                                       check=check)

    def close_session(self, session: str = "main") -> None:
        """Ends a session."""
        self.client.session_close(self.id, session)

    # -- checkpoints ----------------------------------------------------------

    def checkpoint(self, label: Optional[str] = None, *, kind: Optional[str] = None,
                   wait: bool = False, keep: bool = False,
                   progress: Any = None) -> Union[m.Checkpoint, m.TurnResult]:
        """Takes a checkpoint (``kind`` ``fs``, the default, ``full`` or
        ``auto``); see :meth:`Client.checkpoint`."""
        return self.client.checkpoint(self.id, kind=kind, label=label, wait=wait, keep=keep, progress=progress)

    def checkpoints(self) -> List[m.Checkpoint]:
        """The sandbox's checkpoints, oldest first."""
        return self.client.checkpoints(self.id)

    def checkpoint_tree(self) -> List[m.Checkpoint]:
        """The sandbox's checkpoints as a tree (roots with ``children``)."""
        return self.client.checkpoint_tree(self.id)

    def rollback(self, checkpoint: Ref, *, tier: Optional[str] = None, force: bool = False,
                 dry_run: bool = False) -> m.RollbackResult:
        """Returns the sandbox to ``checkpoint`` (an object, ID or label);
        see :meth:`Client.rollback`."""
        return self.client.rollback(self.id, checkpoint, tier=tier, force=force, dry_run=dry_run)

    def commit(self, name: str) -> m.Image:
        """Makes image ``name`` of the sandbox's files; see
        :meth:`Client.commit`."""
        return self.client.commit(self.id, name)

    def fork(self, n: int = 1, *, checkpoint: Optional[Ref] = None, reseed: bool = False,
             progress: Any = None) -> "Forks":
        """Makes ``n`` copies of the sandbox (from ``checkpoint``, or a new
        fs checkpoint) and returns them as :class:`Forks`, a list of
        Sandbox handles that removes them all at the end of a ``with``."""
        res = self.client.fork(self.id, n, checkpoint=checkpoint, reseed=reseed, progress=progress)
        return Forks(self.client, res)

    # -- turns, recovery, LLM, effects ---------------------------------------

    def end_turn(self, *, label: Optional[str] = None, ignore: Optional[Iterable[str]] = None,
                 dry_run: bool = False) -> m.TurnResult:
        """Ends the current turn with the checkpoint it needs."""
        return self.client.end_turn(self.id, label=label, ignore=ignore, dry_run=dry_run)

    def turns(self) -> List[m.TurnRecord]:
        """The turn log."""
        return self.client.turns(self.id)

    def recover(self, *, to: Optional[Ref] = None, force: bool = False,
                dry_run: bool = False) -> m.RecoverResult:
        """Recovers to a committed turn checkpoint; see :meth:`Client.recover`."""
        return self.client.recover(self.id, to=to, force=force, dry_run=dry_run)

    def recovery(self) -> m.RecoveryStatus:
        """Where the fast-forward of a recovery stands."""
        return self.client.recovery(self.id)

    def set_llm(self, upstream: str, **kw: Any) -> m.LLMEndpoint:
        """Gives the sandbox an LLM endpoint; see :meth:`Client.set_llm`."""
        return self.client.set_llm(self.id, upstream, **kw)

    def llm(self) -> m.LLMEndpoint:
        """The sandbox's LLM endpoint."""
        return self.client.llm(self.id)

    def remove_llm(self) -> None:
        """Closes the sandbox's LLM endpoint."""
        self.client.remove_llm(self.id)

    def effects(self, since: Optional[Ref] = None) -> List[m.Effect]:
        """The effect ledger (after ``since``, a checkpoint, if given)."""
        return self.client.effects(self.id, since)

    def declare_effect(self, **kw: Any) -> m.Effect:
        """Records an effect of the agent's own; see :meth:`Client.declare_effect`."""
        return self.client.declare_effect(self.id, **kw)


class Forks(list):
    """The sandboxes a fork made (:class:`Sandbox` handles), with the
    fork's ``result`` (a :class:`~molt.ForkResult`: ``checkpoint``,
    ``duration_ms``, ``forks_per_second``). As a context manager it
    removes them all at exit."""

    def __init__(self, client: Client, result: m.ForkResult) -> None:
        super().__init__(Sandbox._attach(client, info) for info in result.sandboxes or [])
        self.result = result

    @property
    def checkpoint(self) -> str:
        """The checkpoint the forks started from."""
        return self.result.checkpoint

    def remove(self) -> None:
        """Removes every fork."""
        for sb in self:
            sb.remove()

    def __enter__(self) -> "Forks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()
