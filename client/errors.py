"""Exceptions raised by the client, one per gRPC status code the daemon uses."""

from __future__ import annotations

import grpc


class SuffixdError(Exception):
    """An RPC failed. ``code`` is the grpc.StatusCode, ``details`` the daemon's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidArgumentError(SuffixdError, ValueError):
    pass


class NotFoundError(SuffixdError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return SuffixdError.__str__(self)


class AlreadyExistsError(SuffixdError):
    pass


class ResourceExhaustedError(SuffixdError):
    pass


class FailedPreconditionError(SuffixdError):
    pass


class UnauthenticatedError(SuffixdError, PermissionError):
    pass


class PermissionDeniedError(SuffixdError, PermissionError):
    pass


class UnavailableError(SuffixdError, ConnectionError):
    pass


class DeadlineExceededError(SuffixdError, TimeoutError):
    pass


class InternalError(SuffixdError):
    pass


_BY_CODE: dict[grpc.StatusCode, type[SuffixdError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.INTERNAL: InternalError,
}


def from_rpc_error(exc: grpc.RpcError) -> SuffixdError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    return _BY_CODE.get(code, SuffixdError)(code, details)
