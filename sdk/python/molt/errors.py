"""Typed errors of the molt API.

Every error the daemon reports has a kind (the ``kind`` member of the
error body ``{"kind", "message"}``, docs/api.md); each kind has its class
here, all under :class:`MoltError`, so a caller catches what it can handle::

    try:
        c.inspect_sandbox("nope")
    except molt.NotFound:
        ...

The kinds are those of api/v1/errors.go. ``method_not_allowed`` is the
caller's mistake and is raised as :class:`MethodNotAllowed`, a subclass of
:class:`InvalidArgument` (as the Go client maps it to ErrInvalidArgument).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

__all__ = [
    "MoltError",
    "NotFound",
    "AlreadyExists",
    "InvalidArgument",
    "MethodNotAllowed",
    "FailedPrecondition",
    "Unavailable",
    "NotSupported",
    "ResourceExhausted",
    "Conflict",
    "Unauthenticated",
    "PermissionDenied",
    "Internal",
    "ConnectionFailed",
    "StreamError",
    "CommandFailed",
    "CompensationFailed",
    "error_from_body",
]


class MoltError(Exception):
    """Base class of every error this package raises.

    Attributes:
        kind: the API error kind (``"not_found"``, ...), or for errors
            raised on the client side ``"connection"``, ``"stream"``,
            ``"command_failed"``, ``"compensation_failed"``.
        message: the daemon's message.
        status: the HTTP status of the answer (0 when there was none).
        candidates: for an ambiguous reference, references that each
            name one of the objects it matched.
    """

    kind = "unknown"

    def __init__(self, message: str, *, kind: Optional[str] = None, status: int = 0,
                 candidates: Optional[List[str]] = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.message = message
        self.status = status
        self.candidates = list(candidates or [])

    def __str__(self) -> str:
        return self.message


class NotFound(MoltError):
    """The sandbox, checkpoint, image, session or effect does not exist (404)."""

    kind = "not_found"


class AlreadyExists(MoltError):
    """An object of that name already exists (409)."""

    kind = "already_exists"


class InvalidArgument(MoltError):
    """The request is malformed or breaks a rule of the API (400)."""

    kind = "invalid_argument"


class MethodNotAllowed(InvalidArgument):
    """The path exists, but not for this method (405)."""

    kind = "method_not_allowed"


class FailedPrecondition(MoltError):
    """The object is not in a state that allows the request (412), e.g.
    exec in a stopped sandbox, rollback to a failed checkpoint."""

    kind = "failed_precondition"


class Unavailable(MoltError):
    """The daemon cannot serve the request now (503)."""

    kind = "unavailable"


class NotSupported(MoltError):
    """This host cannot do it (501), e.g. a full checkpoint without CRIU."""

    kind = "not_supported"


class ResourceExhausted(MoltError):
    """No room left in the pool beyond the daemon's reserve (507)."""

    kind = "resource_exhausted"


class Conflict(MoltError):
    """The request would break what others rely on (409), e.g. a rollback
    past an effect someone consumed, without ``force``."""

    kind = "conflict"


class Unauthenticated(MoltError):
    """The TCP listener got no valid token (401)."""

    kind = "unauthenticated"


class PermissionDenied(MoltError):
    """The token's scopes do not allow the request (403)."""

    kind = "permission_denied"


class Internal(MoltError):
    """Any other failure of the daemon (500), or an answer that is not an
    error body."""

    kind = "internal"


class ConnectionFailed(MoltError):
    """The daemon could not be reached (no socket, refused, TLS failure)."""

    kind = "connection"


class StreamError(MoltError):
    """An exec stream broke or reported an error before the command's exit
    status."""

    kind = "stream"


class CommandFailed(MoltError):
    """A command run with ``check=True`` exited non-zero; ``result`` is its
    :class:`~molt.ExecResult` or :class:`~molt.SessionResult`."""

    kind = "command_failed"

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


class CompensationFailed(MoltError):
    """A rollback happened but some of its compensations failed: the world
    still has those effects. ``result`` is the :class:`~molt.RollbackResult`
    (its ``compensation`` says which failed and why)."""

    kind = "compensation_failed"

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


_BY_KIND: Dict[str, Type[MoltError]] = {
    cls.kind: cls
    for cls in (NotFound, AlreadyExists, InvalidArgument, MethodNotAllowed,
                FailedPrecondition, Unavailable, NotSupported, ResourceExhausted,
                Conflict, Unauthenticated, PermissionDenied, Internal)
}


def error_from_body(status: int, body: bytes, reason: str = "") -> MoltError:
    """Returns the typed error for a non-2xx answer with ``body``.

    A body that is not an error object becomes :class:`Internal` with the
    status and the body's text, as the Go client does; an unknown kind
    (a newer daemon's) becomes a plain :class:`MoltError` with that kind.
    """
    try:
        import json

        data = json.loads(body.decode("utf-8", "replace"))
        kind, message = data.get("kind"), data.get("message")
        candidates = data.get("candidates") or []
    except (ValueError, AttributeError):
        kind = message = None
        candidates = []
    if not isinstance(message, str) or not message or not isinstance(kind, str):
        text = body[:4096].decode("utf-8", "replace").strip()
        return Internal(f"daemon answered {status} {reason}: {text}".replace("  ", " "), status=status)
    cls = _BY_KIND.get(kind)
    if cls is None:
        return MoltError(message, kind=kind, status=status, candidates=candidates)
    return cls(message, status=status, candidates=candidates)
