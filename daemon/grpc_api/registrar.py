"""What a servicer's ``register(server, engine)`` needs of the server it registers on."""

from __future__ import annotations

from typing import Any, Protocol


class ServiceRegistrar(Protocol):
    """The calls the generated ``add_*Servicer_to_server`` functions make. The daemon's
    ``LoopServer`` (daemon/server/loop_server.py: a grpc.aio server driven from sync code)
    has them, and so does a plain ``grpc.Server``."""

    def add_generic_rpc_handlers(self, handlers: Any) -> None: ...
    def add_registered_method_handlers(self, service_name: str, handlers: Any) -> None: ...
