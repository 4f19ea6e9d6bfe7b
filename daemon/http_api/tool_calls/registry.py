"""The one registry of tool-call formats, each with its stream class; FORMATS, call_stream.

The formats are in the order ``detect_format`` asks them; ``FORMATS`` (by name) and
``call_stream`` read the registry.

Adding a format: its module beside the others (a ``ToolFormat`` subclass and its instance, a
``CallStream`` subclass) and its line in ``_REGISTERED``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ToolFormat
from .generic import GENERIC, GenericStream
from .hermes import HERMES, HermesStream
from .llama3_json import LLAMA3_JSON, Llama3JsonStream
from .mistral import MISTRAL, MistralStream
from .stream import CallStream


@dataclass(frozen=True)
class Registered:
    """A format and the class that reads its outputs as they are generated."""

    fmt: ToolFormat
    stream: type[CallStream]


# In the order llama.cpp's common_chat_templates_apply_jinja tests a chat template for the
# families (detect_format takes the first format that claims it); generic claims any, last.
_REGISTERED = (
    Registered(HERMES, HermesStream),
    Registered(LLAMA3_JSON, Llama3JsonStream),
    Registered(MISTRAL, MistralStream),
    Registered(GENERIC, GenericStream),
)
_BY_NAME: dict[str, Registered] = {entry.fmt.name: entry for entry in _REGISTERED}
assert len(_BY_NAME) == len(_REGISTERED), "two formats of one name"

FORMATS: dict[str, ToolFormat] = {name: entry.fmt for name, entry in _BY_NAME.items()}


def call_stream(fmt: ToolFormat, *, strict: bool = False) -> CallStream:
    """A reader of one output of ``fmt`` as it is generated (``CallStream``).

    Args:
        fmt: a registered format.
        strict: a JSON object without arguments is an answer, not a call (``CallStream``).

    Raises:
        KeyError: ``fmt`` is not registered.
    """
    return _BY_NAME[fmt.name].stream(fmt, strict=strict)
