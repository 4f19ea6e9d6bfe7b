"""Python client for the suffixd daemon: ``Client`` (sync), ``AsyncClient`` (asyncio),
and ``SuffixDraftModel`` (llama-cpp-python draft model backed by the daemon)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import Client, Session, Stepper
from .errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SuffixdError,
    UnauthenticatedError,
    UnavailableError,
)
from .types import AppendResult, Draft, SessionInfo

if TYPE_CHECKING:  # the names __getattr__ loads on first use, for the type checker
    from .aio import AsyncClient, AsyncSession, AsyncStepper
    from .draft_model import SuffixDraftModel

__all__ = [
    "AlreadyExistsError", "AppendResult", "AsyncClient", "AsyncSession", "AsyncStepper",
    "Client", "DeadlineExceededError", "Draft", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "NotFoundError", "PermissionDeniedError",
    "ResourceExhaustedError", "Session", "SessionInfo", "Stepper", "SuffixDraftModel",
    "SuffixdError", "UnauthenticatedError", "UnavailableError",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: grpc.aio and llama_cpp are not needed by every user.
    if name in ("AsyncClient", "AsyncSession", "AsyncStepper"):
        from . import aio

        return getattr(aio, name)
    if name == "SuffixDraftModel":
        from .draft_model import SuffixDraftModel

        return SuffixDraftModel
    raise AttributeError(name)
