"""molt: checkpoint, rollback and fork for AI-agent sandboxes.

The Python SDK of molt's REST API (docs/api.md), standard library only::

    import molt

    with molt.Client() as c, c.sandbox(image="debian") as sb:
        sb.run("cd /srv && echo draft > notes")
        ck = sb.checkpoint(label="before")
        if not sb.run("make -C /srv").ok:
            sb.rollback(ck)

:class:`Client` is one daemon (its unix socket, or a TLS endpoint with a
tenant's token); :class:`Sandbox` is one sandbox; errors are the
subclasses of :class:`MoltError`, one per API error kind.
"""

from .client import DEFAULT_SOCKET, Client
from .errors import (AlreadyExists, CommandFailed, CompensationFailed, Conflict, ConnectionFailed,
                     FailedPrecondition, Internal, InvalidArgument, MethodNotAllowed, MoltError,
                     NotFound, NotSupported, PermissionDenied, ResourceExhausted, StreamError,
                     Unauthenticated, Unavailable)
from .exec import ExecResult, ExecStream, OutputChunk
from .models import (AuditVerifyResult, ChainVerification, Checkpoint, DataKey, Effect, ForkResult,
                     HostInfo, Image, LLMEndpoint, Model, RecoverResult, RecoveryStatus,
                     RollbackResult, SandboxInfo, Session, SessionResult, ShredResult, Tenant, Token,
                     TurnRecord, TurnResult, checkpoint_tree)
from .sandbox import Forks, Sandbox

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Forks", "DEFAULT_SOCKET",
    "ExecResult", "ExecStream", "OutputChunk",
    "MoltError", "NotFound", "AlreadyExists", "InvalidArgument", "MethodNotAllowed",
    "FailedPrecondition", "Unavailable", "NotSupported", "ResourceExhausted", "Conflict",
    "Unauthenticated", "PermissionDenied", "Internal", "ConnectionFailed", "StreamError",
    "CommandFailed", "CompensationFailed",
    "Model", "HostInfo", "Image", "SandboxInfo", "Session", "Checkpoint", "RollbackResult",
    "ForkResult", "SessionResult", "TurnResult", "TurnRecord", "LLMEndpoint", "Effect",
    "RecoverResult", "RecoveryStatus", "ChainVerification", "Tenant", "Token", "DataKey",
    "ShredResult", "AuditVerifyResult", "checkpoint_tree",
]
