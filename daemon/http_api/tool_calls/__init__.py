"""Tool calls in a model's output: parsed, rendered, read as generated; a module per format.

Interface: ``ToolCall`` (name, arguments as JSON text, id) and ``Parsed`` (content, calls);
one ``ToolFormat`` per model family, each with ``parse(text, tool_names)``,
``render(calls, content)``, ``call_start(text)`` (where streaming must stop releasing
content), ``json_schema(tools, required=, parallel=)`` and the ``prefix``/``suffix`` text
around one call (to build a grammar as prefix + call JSON + suffix); ``FORMATS`` (by name),
``detect_format(chat_template)`` and ``call_id()``. The generic format also gives
``system_prompt(tools, parallel)``. ``call_stream(fmt)`` -> ``CallStream`` reads one output
as it is generated (``feed(piece)`` -> content and ``CallDelta``s that may go out now,
``finish()`` -> ``StreamEnd``): what the endpoint streams, and, fed at once, what it answers.
Standard library only: the package knows nothing of the daemon.

Modules: ``base`` (the types, the JSON helpers, ``ToolFormat``), ``json_reader`` (the
incremental JSON reader), ``stream`` (``CallStream``, the base of the streams), one module
per format with its parser and its stream (``hermes``, ``llama3_json``, ``mistral``,
``generic``: the formats llama.cpp's server, llama-server, parses for these families),
``registry`` (each format with its stream class; ``FORMATS``, ``call_stream``) and
``detection`` (``detect_format``). Adding a format: its module, and its line in the
registry.

What llama.cpp does, read in ggml-org/llama.cpp (``common/chat-parser.cpp`` and
``common/chat.cpp`` at 05e5139a; each format's module names the functions it follows), and
every format here does too:

- Unknown function names: kept as calls. Every parser hands its calls to
  ``common_chat_msg_parser::add_tool_call``, which refuses only an empty name; nothing
  compares the name with the request's tools (the grammar built from the tools is what keeps
  a model to their names). So ``tool_names`` does not filter here either: the caller gets the
  call and decides.
- Broken JSON after a marker: the parsers throw ``common_chat_msg_partial_exception``, and
  ``common_chat_parse`` (for a finished output) drops the calls and re-reads the whole text as
  content (``common_chat_parse_content_only``). Same here: no calls, the whole text as
  content, nothing lost. A call of the wrong shape (no name, arguments not an object) counts
  as broken too.

Whitespace between content and a call is dropped (``render`` puts a newline there), so
``call_start`` holds back trailing whitespace too: content released while streaming is always
a prefix of the content ``parse`` gives for the whole output.
"""

from __future__ import annotations

from .base import Parsed, ToolCall, ToolFormat, call_id
from .detection import detect_format
from .generic import GENERIC, GenericFormat
from .hermes import HERMES, HermesFormat
from .llama3_json import LLAMA3_JSON, Llama3JsonFormat
from .mistral import MISTRAL, MistralFormat
from .registry import FORMATS, call_stream
from .stream import CallDelta, CallStream, StreamEnd

__all__ = [
    "FORMATS",
    "GENERIC",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "CallDelta",
    "CallStream",
    "GenericFormat",
    "HermesFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "Parsed",
    "StreamEnd",
    "ToolCall",
    "ToolFormat",
    "call_id",
    "call_stream",
    "detect_format",
]
