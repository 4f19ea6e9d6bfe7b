from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GeneratorStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GeneratorStatusResponse(_message.Message):
    __slots__ = ("loaded", "model", "cost_profile", "batch_padding", "draft_model", "phase", "phase_seconds", "batching", "cost_profile_source", "prompt_cache", "determinism")
    class CostProfileEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    class BatchPaddingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    LOADED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    COST_PROFILE_FIELD_NUMBER: _ClassVar[int]
    BATCH_PADDING_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    COST_PROFILE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CACHE_FIELD_NUMBER: _ClassVar[int]
    DETERMINISM_FIELD_NUMBER: _ClassVar[int]
    loaded: bool
    model: str
    cost_profile: _containers.ScalarMap[int, float]
    batch_padding: _containers.ScalarMap[int, int]
    draft_model: str
    phase: str
    phase_seconds: float
    batching: str
    cost_profile_source: str
    prompt_cache: str
    determinism: str
    def __init__(self, loaded: _Optional[bool] = ..., model: _Optional[str] = ..., cost_profile: _Optional[_Mapping[int, float]] = ..., batch_padding: _Optional[_Mapping[int, int]] = ..., draft_model: _Optional[str] = ..., phase: _Optional[str] = ..., phase_seconds: _Optional[float] = ..., batching: _Optional[str] = ..., cost_profile_source: _Optional[str] = ..., prompt_cache: _Optional[str] = ..., determinism: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class PromptTokens(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "text", "tokens", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "no_bos", "ignore_eos", "max_draft_tokens")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    NO_BOS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    text: str
    tokens: PromptTokens
    messages: ChatMessages
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    no_bos: bool
    ignore_eos: bool
    max_draft_tokens: int
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., text: _Optional[str] = ..., tokens: _Optional[_Union[PromptTokens, _Mapping]] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., no_bos: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., max_draft_tokens: _Optional[int] = ...) -> None: ...

class SourceTotals(_message.Message):
    __slots__ = ("steps", "proposed", "accepted")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    steps: int
    proposed: int
    accepted: int
    def __init__(self, steps: _Optional[int] = ..., proposed: _Optional[int] = ..., accepted: _Optional[int] = ...) -> None: ...

class GenerateTotals(_message.Message):
    __slots__ = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "steps", "drafted_tokens", "accepted_tokens", "prompt_seconds", "first_token_seconds", "decode_seconds", "total_seconds", "by_source", "draft_model")
    class BySourceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SourceTotals
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SourceTotals, _Mapping]] = ...) -> None: ...
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    steps: int
    drafted_tokens: int
    accepted_tokens: int
    prompt_seconds: float
    first_token_seconds: float
    decode_seconds: float
    total_seconds: float
    by_source: _containers.MessageMap[str, SourceTotals]
    draft_model: str
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., steps: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., prompt_seconds: _Optional[float] = ..., first_token_seconds: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ..., by_source: _Optional[_Mapping[str, SourceTotals]] = ..., draft_model: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "source", "proposed", "accepted", "finish_reason", "totals")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    source: str
    proposed: int
    accepted: int
    finish_reason: str
    totals: GenerateTotals
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., source: _Optional[str] = ..., proposed: _Optional[int] = ..., accepted: _Optional[int] = ..., finish_reason: _Optional[str] = ..., totals: _Optional[_Union[GenerateTotals, _Mapping]] = ...) -> None: ...
