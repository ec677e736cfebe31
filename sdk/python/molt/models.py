"""The API's JSON objects, as dicts with attribute access.

Each model is the decoded JSON object itself (a ``dict``), so every
member the daemon sends is there, including members newer than this
package (the API grows by addition). Its known members (api/v1/types.go)
also read as attributes; a known member the daemon left out (JSON
``omitempty``) reads as ``None``, an unknown name raises AttributeError.
Nested objects are models too.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Type

__all__ = [
    "Model", "HostInfo", "Image", "SandboxInfo", "Session", "Checkpoint",
    "RollbackResult", "ForkResult", "SessionResult", "TurnResult", "TurnRecord",
    "LLMEndpoint", "Effect", "RecoverResult", "RecoveryStatus",
    "ChainVerification", "Tenant", "Token", "DataKey", "ShredResult",
    "AuditVerifyResult", "checkpoint_tree",
]


class Model(dict):
    """A JSON object of the API. ``m.field`` is ``m["field"]``; a known
    field the answer left out is ``None``."""

    _fields: Tuple[str, ...] = ()
    _nested: Dict[str, Type["Model"]] = {}

    def __init__(self, data: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(data or {})
        for k, v in list(self.items()):
            self[k] = _wrap(v, self._nested.get(k, Model))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            if name in self._fields:
                return None
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


def _wrap(v: Any, cls: Type[Model]) -> Any:
    if isinstance(v, dict) and not isinstance(v, Model):
        return cls(v)
    if isinstance(v, list):
        return [_wrap(x, cls) for x in v]
    return v


class HostInfo(Model):
    """The host and what molt can do on it (``GET /v1/host``): ``version``,
    ``kernel``, ``root``, ``pool`` (``dir``, ``loop``, ``size_bytes``,
    ``free_bytes``, ``node_size``), ``cgroup``, ``features`` (each
    ``name``, ``supported``, ``detail``, ``reason``), ``sandboxes``,
    ``started``."""

    _fields = ("version", "kernel", "root", "pool", "cgroup", "features", "sandboxes", "started")


class Image(Model):
    """A read-only root filesystem: ``name``, ``source``, ``created``,
    ``size_bytes``."""

    _fields = ("name", "source", "created", "size_bytes")


class Session(Model):
    """A persistent shell in a sandbox: ``name``, ``pid``, ``alive``."""

    _fields = ("name", "pid", "alive")


class SandboxInfo(Model):
    """A sandbox as the API reports it. ``state`` is ``creating``,
    ``running``, ``stopped``, ``hibernated`` or ``lost`` (``reason`` says
    why); ``head`` is the checkpoint it last rolled back to or was made
    from. An inspection adds live details: ``sessions``, ``memory_bytes``,
    ``processes``, ``standby``, ``disk_used_bytes``."""

    _fields = ("id", "name", "tenant", "image", "hostname", "state", "reason", "offloaded", "created", "pid",
               "env_names", "secrets", "resources", "seccomp", "head", "forked_from", "standby",
               "standbys", "standby_bytes", "sessions", "memory_bytes", "processes",
               "disk_used_bytes", "limits_tampered", "last_tampered", "network", "address",
               "egress", "effect_policy", "compensation")
    _nested = {"sessions": Session}


class Checkpoint(Model):
    """One node of a sandbox's checkpoint tree: ``id``, ``sandbox``,
    ``parent``, ``kind`` (``fs`` or ``full``), ``label``, ``created``,
    ``stall_ms``, ``duration_ms``, ``bytes_written``, ``pending`` (captured,
    not committed yet), ``failed`` with ``failed_reason``, ``keep``; a full
    one also ``capture``, ``stall_parts``, ``image_bytes``. Built by
    :func:`checkpoint_tree`, it also has ``children``."""

    _fields = ("id", "sandbox", "parent", "kind", "label", "created", "stall_ms", "duration_ms",
               "capture", "capture_note", "stall_parts", "bytes_written", "image_bytes", "keep",
               "pending", "failed", "failed_reason", "data_key", "in_store", "offloaded", "children")


class RollbackResult(Model):
    """How a rollback went: ``tier`` (``hot``, ``warm``, ``cold`` or
    ``restart``), ``duration_ms``, ``processes_restarted``, ``note``,
    ``plan`` (what it does to the effect ledger: ``orphan``, ``replay``,
    ``compensate``, ``block``, ``decisions``) and ``compensation``."""

    _fields = ("sandbox", "checkpoint", "tier", "duration_ms", "processes_restarted", "note",
               "plan", "compensation")


class ForkResult(Model):
    """The sandboxes a fork made: ``checkpoint``, ``sandboxes`` (each a
    :class:`SandboxInfo`), ``duration_ms``, ``forks_per_second``,
    ``reseeded``."""

    _fields = ("checkpoint", "sandboxes", "duration_ms", "forks_per_second", "reseeded")
    _nested = {"sandboxes": SandboxInfo}


class SessionResult(Model):
    """The outcome of one session command: ``stdout``, ``stderr`` (text),
    ``exit_code``, ``timed_out``, ``truncated`` (output past the per-call
    limit was dropped), ``duration_ms``, ``replayed`` (a recovery's
    fast-forward answered from the turn log)."""

    _fields = ("stdout", "stderr", "exit_code", "timed_out", "truncated", "duration_ms", "replayed")

    @property
    def ok(self) -> bool:
        """Whether the command exited 0."""
        return self.get("exit_code", 0) == 0


class TurnResult(Model):
    """What ending a turn decided and did: ``turn``, ``decision``
    (``none``, ``fs`` or ``full``), ``checkpoint`` (None for none),
    ``head``, ``reasons``, ``effects``, ``decide_ms``, ``stall_ms``,
    ``duration_ms``, ``pending`` (docs/turns.md)."""

    _fields = ("sandbox", "turn", "decision", "checkpoint", "head", "reasons", "effects",
               "decide_ms", "stall_ms", "duration_ms", "pending")


class TurnRecord(TurnResult):
    """A finished turn of the turn log: a :class:`TurnResult` plus
    ``prev``, ``incomplete``, ``started``, ``ended``, ``commands`` (each with
    its output and ``exit_code``) and ``llm`` (the LLM calls that ended it),
    redacted."""

    _fields = TurnResult._fields + ("prev", "incomplete", "started", "ended", "commands", "llm")


class LLMEndpoint(Model):
    """A sandbox's LLM endpoint: ``url`` (give it to the agent as its LLM
    base URL), ``upstream``, ``gate``, and ``token`` (only in the answer
    that set it)."""

    _fields = ("sandbox", "url", "upstream", "gate", "token")


class Effect(Model):
    """One record of a sandbox's effect ledger (docs/egress.md): ``id``,
    ``seq``, ``kind`` (``read``, ``effect``, ``opaque``), ``state``,
    ``method``, ``url``, ``host``, ``status``, ``orphan``, ``declared``,
    ``type``, ``compensator``, ``depends_on``, ``compensation``,
    ``consumers``, ``started``, ``finished``, ..."""

    _fields = ("id", "seq", "prev", "sandbox", "origin", "turn", "checkpoint", "kind", "state",
               "proto", "method", "url", "host", "addr", "body_hash", "idempotency_key", "status",
               "response_header", "response_body", "response_bytes", "bytes_out", "bytes_in",
               "answers", "error", "replay_of", "orphan", "declared", "type", "compensator",
               "depends_on", "compensation", "consumers", "started", "finished")


class RecoverResult(Model):
    """What a recovery did (docs/recovery.md): ``checkpoint``, ``turn``
    (the last turn replayed), ``turns``, ``llm_calls``, ``commands``,
    ``bytes``, ``rollback``, ``dry_run``, ``note``."""

    _fields = ("sandbox", "checkpoint", "turn", "turns", "llm_calls", "commands", "bytes",
               "rollback", "dry_run", "note")
    _nested = {"rollback": RollbackResult}


class RecoveryStatus(Model):
    """Where a sandbox's fast-forward stands: ``state`` (``none``,
    ``fast-forward``, ``done``, ``diverged``), ``replayed`` of ``total``,
    ``bytes``, ``divergence``."""

    _fields = ("sandbox", "state", "checkpoint", "turn", "replayed", "total", "bytes", "divergence")


class ChainVerification(Model):
    """A checkpoint's lineage as verified: ``ok``, ``links`` (each ``id``,
    ``parent``, ``key``, ``problem``), ``key``, ``trusted``."""

    _fields = ("checkpoint", "ok", "links", "key", "trusted")


class Tenant(Model):
    """A tenant: ``name``, ``created``."""

    _fields = ("name", "created")


class Token(Model):
    """A tenant's API token: ``id``, ``tenant``, ``scopes``, ``sandboxes``,
    ``note``, ``created``; ``token``, the secret, only when created."""

    _fields = ("id", "tenant", "scopes", "sandboxes", "note", "created", "token")


class DataKey(Model):
    """A tenant data key of encryption at rest (never its material):
    ``tenant``, ``id``, ``kek``, ``current``, ``created``."""

    _fields = ("tenant", "id", "kek", "current", "created")


class ShredResult(Model):
    """Keys shredded: ``tenant``, ``shredded``."""

    _fields = ("tenant", "shredded")


class AuditVerifyResult(Model):
    """The audit log's verification: ``ok``, ``entries``, ``head``,
    ``anchor``; for a failure ``bad_seq``, ``bad_line``, ``problem``."""

    _fields = ("ok", "entries", "first_seq", "head", "anchor", "partial", "segment", "bad_seq",
               "bad_line", "problem", "file")


def checkpoint_tree(checkpoints: Iterable[Checkpoint]) -> List[Checkpoint]:
    """Links a sandbox's checkpoints (a list as ``checkpoints()`` returns,
    oldest first) into their tree: each gets ``children`` (oldest first),
    and the roots (no parent, or a parent not in the list) are returned."""
    cks = [c if isinstance(c, Checkpoint) else Checkpoint(c) for c in checkpoints]
    by_id = {c["id"]: c for c in cks}
    roots: List[Checkpoint] = []
    for c in cks:
        c["children"] = []
    for c in cks:
        parent = by_id.get(c.get("parent") or "")
        (parent["children"] if parent is not None else roots).append(c)
    return roots
