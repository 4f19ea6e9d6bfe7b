"""The format a model writes tool calls in, told from its chat template: ``detect_format``."""

from __future__ import annotations

from .base import ToolFormat
from .generic import GENERIC
from .registry import FORMATS


def detect_format(chat_template: str) -> ToolFormat:
    """The format a model writes calls in, from its GGUF's Jinja chat template: the first
    registered format that claims the template (the checks and their order are llama.cpp's
    common_chat_templates_apply_jinja), else generic."""
    return next((fmt for fmt in FORMATS.values() if fmt.claims(chat_template)), GENERIC)
