"""Bearer-token authentication for TCP listeners (a grpc.aio server interceptor).

Clients send ``authorization: Bearer <token>`` metadata (the scheme in any case, as
RFC 7235 has it and the HTTP front takes it). The Unix socket is
protected by its file mode instead (0600), so the interceptor is only installed
when a TCP listener without ``--insecure`` is configured; on such a server it
also guards the Unix socket, which costs one dictionary lookup per RPC.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
import grpc.aio

from ..http_api.guard import bearer_matches

# Either kind of method handler (the interceptor passes any through or denies it)
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

# Health checks stay open so load balancers and orchestrators can probe the daemon
# without holding the secret; they reveal nothing but SERVING / NOT_SERVING.
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


def _deny(handler: _Handler, message: str) -> _Handler:
    # A coroutine for every kind of method (for a response-streaming one, aio takes a
    # coroutine that writes nothing as the reader/writer style): it only aborts.
    async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty auth token would accept everyone")
        self._token = token.encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails],
                               Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method in OPEN_METHODS:
            return handler
        got = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else value
                break
        if got is None:
            return _deny(handler, "missing bearer token (metadata 'authorization: Bearer ...')")
        if not bearer_matches(got, self._token):
            return _deny(handler, "wrong bearer token")
        return handler
