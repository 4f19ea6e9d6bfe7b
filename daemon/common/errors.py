"""Engine errors, each tied to the gRPC status code the servicers answer with.

The engine raises these (it knows nothing of gRPC); daemon/grpc_api/suffixd_service.py maps
``EngineError.code`` (a grpc.StatusCode name) onto the RPC status.
"""

from __future__ import annotations


class EngineError(Exception):
    code = "INTERNAL"


class InvalidArgument(EngineError):
    code = "INVALID_ARGUMENT"


class NotFound(EngineError):
    code = "NOT_FOUND"


class AlreadyExists(EngineError):
    code = "ALREADY_EXISTS"


class ResourceExhausted(EngineError):
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(EngineError):
    code = "FAILED_PRECONDITION"


class Unavailable(EngineError):
    code = "UNAVAILABLE"
