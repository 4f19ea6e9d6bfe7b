"""What the rooms of ``Fleet`` call of each other: the contract, typed.

``Fleet`` (daemon/fleet/node.py) is one class assembled from four mixins ("rooms":
publish.py, consume.py, snapshot.py, status.py) over the node's shared state. Each room's
module docstring says in prose what it uses of the others; ``FleetRooms`` says it to the
type checker. Every room derives from it while type checking only (``RoomBase``): at run
time the rooms derive from ``object``, so these bodiless declarations can never shadow
the real methods in ``Fleet``'s method resolution order, and mypy refuses to instantiate
a ``Fleet`` that lacks one of them (they are abstract members of an explicit subclass of
a protocol).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

# An entry's replica record: {ns, id (stream id), sep (the stream's epoch after it), src, n}
Rep = dict[str, Any]


class FleetRooms(Protocol):
    # the connection state (daemon/fleet/node.py)
    def _join(self) -> None: ...
    def _up(self) -> None: ...
    def _down(self, exc: BaseException) -> None: ...

    # the consumer and its appliers (daemon/fleet/consume.py)
    def _discover(self) -> None: ...
    def stream_epoch(self, ns: str, ep: int) -> int: ...
    def _drop(self, ns: str, ep: int, rep: Rep | None) -> None: ...
    def _add_to_tree(self, ns: str, seq: int, toks: list[int]) -> None: ...
    def _apply_evict(self, ns: str, e: dict[str, Any], rep: Rep | None) -> bool: ...

    # snapshots (daemon/fleet/snapshot.py)
    def _load_snapshot(self, ns: str) -> None: ...
    def _write_snapshot(self, ns: str) -> None: ...

    # the heartbeat (daemon/fleet/status.py)
    def _housekeeping(self) -> None: ...


if TYPE_CHECKING:
    RoomBase = FleetRooms
else:
    RoomBase = object
