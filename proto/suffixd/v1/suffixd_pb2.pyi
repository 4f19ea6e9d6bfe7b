from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KIND_UNSPECIFIED: _ClassVar[Kind]
    KIND_PROMPT: _ClassVar[Kind]
    KIND_TOOL: _ClassVar[Kind]
    KIND_RESPONSE: _ClassVar[Kind]
    KIND_GENERATED: _ClassVar[Kind]
KIND_UNSPECIFIED: Kind
KIND_PROMPT: Kind
KIND_TOOL: Kind
KIND_RESPONSE: Kind
KIND_GENERATED: Kind

class TokenList(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_message_bytes", "max_tokens_per_call", "max_sessions_per_namespace", "session_idle_timeout_s", "max_draft_tokens", "max_namespaces", "max_session_tokens", "max_session_bytes", "max_total_session_tokens", "max_total_session_bytes")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_PER_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSION_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_SESSION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_SESSION_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_tokens_per_call: int
    max_sessions_per_namespace: int
    session_idle_timeout_s: float
    max_draft_tokens: int
    max_namespaces: int
    max_session_tokens: int
    max_session_bytes: int
    max_total_session_tokens: int
    max_total_session_bytes: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_tokens_per_call: _Optional[int] = ..., max_sessions_per_namespace: _Optional[int] = ..., session_idle_timeout_s: _Optional[float] = ..., max_draft_tokens: _Optional[int] = ..., max_namespaces: _Optional[int] = ..., max_session_tokens: _Optional[int] = ..., max_session_bytes: _Optional[int] = ..., max_total_session_tokens: _Optional[int] = ..., max_total_session_bytes: _Optional[int] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("version", "model_path", "vocab_size", "tokenizer_fingerprint", "data_dir", "limits", "services", "rebuilding", "rebuild_tokens", "rebuild_seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    REBUILDING_FIELD_NUMBER: _ClassVar[int]
    REBUILD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REBUILD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: str
    model_path: str
    vocab_size: int
    tokenizer_fingerprint: str
    data_dir: str
    limits: Limits
    services: _containers.RepeatedScalarFieldContainer[str]
    rebuilding: bool
    rebuild_tokens: int
    rebuild_seconds: float
    def __init__(self, version: _Optional[str] = ..., model_path: _Optional[str] = ..., vocab_size: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., data_dir: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., services: _Optional[_Iterable[str]] = ..., rebuilding: _Optional[bool] = ..., rebuild_tokens: _Optional[int] = ..., rebuild_seconds: _Optional[float] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "metadata", "tokens", "text")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    metadata: _containers.ScalarMap[str, str]
    tokens: TokenList
    text: str
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., tokens: _Optional[_Union[TokenList, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("namespace", "session_id", "metadata", "tokens", "created_at", "last_active_at", "responses", "counters", "tail")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_AT_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    metadata: _containers.ScalarMap[str, str]
    tokens: int
    created_at: float
    last_active_at: float
    responses: int
    counters: Counters
    tail: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., tokens: _Optional[int] = ..., created_at: _Optional[float] = ..., last_active_at: _Optional[float] = ..., responses: _Optional[int] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ..., tail: _Optional[_Iterable[int]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "keep_responses")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_RESPONSES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    keep_responses: bool
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., keep_responses: _Optional[bool] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("tokens", "responses_kept")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_KEPT_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    responses_kept: int
    def __init__(self, tokens: _Optional[int] = ..., responses_kept: _Optional[int] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...

class DescribeSessionRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "include_counters", "tail_tokens")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    TAIL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    include_counters: bool
    tail_tokens: int
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., include_counters: _Optional[bool] = ..., tail_tokens: _Optional[int] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "kind", "tokens", "text")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    kind: Kind
    tokens: TokenList
    text: str
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., kind: _Optional[_Union[Kind, str]] = ..., tokens: _Optional[_Union[TokenList, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("appended", "session_tokens", "accepted", "ids")
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    appended: int
    session_tokens: int
    accepted: int
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, appended: _Optional[int] = ..., session_tokens: _Optional[int] = ..., accepted: _Optional[int] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AppendBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[AppendRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[AppendRequest, _Mapping]]] = ...) -> None: ...

class IngestSummary(_message.Message):
    __slots__ = ("items", "tokens")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    items: int
    tokens: int
    def __init__(self, items: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class CostProfile(_message.Message):
    __slots__ = ("k", "cost")
    K_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    k: _containers.RepeatedScalarFieldContainer[int]
    cost: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, k: _Optional[_Iterable[int]] = ..., cost: _Optional[_Iterable[float]] = ...) -> None: ...

class SpeculateRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "context", "max_tokens", "cost_profile", "append", "append_kind")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_PROFILE_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    APPEND_KIND_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    context: TokenList
    max_tokens: int
    cost_profile: CostProfile
    append: TokenList
    append_kind: Kind
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., context: _Optional[_Union[TokenList, _Mapping]] = ..., max_tokens: _Optional[int] = ..., cost_profile: _Optional[_Union[CostProfile, _Mapping]] = ..., append: _Optional[_Union[TokenList, _Mapping]] = ..., append_kind: _Optional[_Union[Kind, str]] = ...) -> None: ...

class SpeculateResponse(_message.Message):
    __slots__ = ("tokens", "parents", "probs", "match_len", "source", "sources", "score", "accepted", "session_tokens", "durable_tokens")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    MATCH_LEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    match_len: int
    source: str
    sources: _containers.RepeatedScalarFieldContainer[str]
    score: float
    accepted: int
    session_tokens: int
    durable_tokens: int
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ..., match_len: _Optional[int] = ..., source: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ..., score: _Optional[float] = ..., accepted: _Optional[int] = ..., session_tokens: _Optional[int] = ..., durable_tokens: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "append", "append_kind", "max_tokens", "cost_profile", "no_draft", "defer_commit")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    APPEND_KIND_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_PROFILE_FIELD_NUMBER: _ClassVar[int]
    NO_DRAFT_FIELD_NUMBER: _ClassVar[int]
    DEFER_COMMIT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    append: _containers.RepeatedScalarFieldContainer[int]
    append_kind: Kind
    max_tokens: int
    cost_profile: CostProfile
    no_draft: bool
    defer_commit: bool
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., append: _Optional[_Iterable[int]] = ..., append_kind: _Optional[_Union[Kind, str]] = ..., max_tokens: _Optional[int] = ..., cost_profile: _Optional[_Union[CostProfile, _Mapping]] = ..., no_draft: _Optional[bool] = ..., defer_commit: _Optional[bool] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("namespace", "session_id", "include_sessions", "top_documents", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TOP_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    session_id: str
    include_sessions: bool
    top_documents: int
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., session_id: _Optional[str] = ..., include_sessions: _Optional[bool] = ..., top_documents: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SourceCount(_message.Message):
    __slots__ = ("source", "steps", "proposed", "accepted")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    source: str
    steps: int
    proposed: int
    accepted: int
    def __init__(self, source: _Optional[str] = ..., steps: _Optional[int] = ..., proposed: _Optional[int] = ..., accepted: _Optional[int] = ...) -> None: ...

class Counters(_message.Message):
    __slots__ = ("requests", "steps", "draft_tokens_proposed", "draft_tokens_accepted", "acceptance_rate", "mean_accepted_per_step", "by_source", "forward_passes_saved", "generated_tokens", "speculate_calls")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_PROPOSED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    BY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_SAVED_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPECULATE_CALLS_FIELD_NUMBER: _ClassVar[int]
    requests: int
    steps: int
    draft_tokens_proposed: int
    draft_tokens_accepted: int
    acceptance_rate: float
    mean_accepted_per_step: float
    by_source: _containers.RepeatedCompositeFieldContainer[SourceCount]
    forward_passes_saved: int
    generated_tokens: int
    speculate_calls: int
    def __init__(self, requests: _Optional[int] = ..., steps: _Optional[int] = ..., draft_tokens_proposed: _Optional[int] = ..., draft_tokens_accepted: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., mean_accepted_per_step: _Optional[float] = ..., by_source: _Optional[_Iterable[_Union[SourceCount, _Mapping]]] = ..., forward_passes_saved: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., speculate_calls: _Optional[int] = ...) -> None: ...

class TreeSize(_message.Message):
    __slots__ = ("sequences", "tokens", "nodes", "bytes", "evictions")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    sequences: int
    tokens: int
    nodes: int
    bytes: int
    evictions: int
    def __init__(self, sequences: _Optional[int] = ..., tokens: _Optional[int] = ..., nodes: _Optional[int] = ..., bytes: _Optional[int] = ..., evictions: _Optional[int] = ...) -> None: ...

class DocumentStat(_message.Message):
    __slots__ = ("doc_key", "accepted")
    DOC_KEY_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    doc_key: str
    accepted: int
    def __init__(self, doc_key: _Optional[str] = ..., accepted: _Optional[int] = ...) -> None: ...

class SessionStats(_message.Message):
    __slots__ = ("session_id", "counters", "tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    counters: Counters
    tokens: int
    def __init__(self, session_id: _Optional[str] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ..., tokens: _Optional[int] = ...) -> None: ...

class NamespaceStats(_message.Message):
    __slots__ = ("namespace", "counters", "corpus", "sessions", "open_sessions", "top_documents", "session_stats")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_FIELD_NUMBER: _ClassVar[int]
    CORPUS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TOP_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_STATS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    counters: Counters
    corpus: TreeSize
    sessions: TreeSize
    open_sessions: int
    top_documents: _containers.RepeatedCompositeFieldContainer[DocumentStat]
    session_stats: _containers.RepeatedCompositeFieldContainer[SessionStats]
    def __init__(self, namespace: _Optional[str] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ..., corpus: _Optional[_Union[TreeSize, _Mapping]] = ..., sessions: _Optional[_Union[TreeSize, _Mapping]] = ..., open_sessions: _Optional[int] = ..., top_documents: _Optional[_Iterable[_Union[DocumentStat, _Mapping]]] = ..., session_stats: _Optional[_Iterable[_Union[SessionStats, _Mapping]]] = ..., **kwargs) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("namespaces", "fleet_json", "next_page_token", "namespaces_total", "memory", "process_memory_json")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    FLEET_JSON_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    PROCESS_MEMORY_JSON_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceStats]
    fleet_json: str
    next_page_token: str
    namespaces_total: int
    memory: _containers.RepeatedCompositeFieldContainer[TreeMemory]
    process_memory_json: str
    def __init__(self, namespaces: _Optional[_Iterable[_Union[NamespaceStats, _Mapping]]] = ..., fleet_json: _Optional[str] = ..., next_page_token: _Optional[str] = ..., namespaces_total: _Optional[int] = ..., memory: _Optional[_Iterable[_Union[TreeMemory, _Mapping]]] = ..., process_memory_json: _Optional[str] = ...) -> None: ...

class TreeMemory(_message.Message):
    __slots__ = ("kind", "trees", "tokens", "bytes", "budget_tokens", "budget_bytes", "budget_tokens_per_tree", "budget_bytes_per_tree")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TREES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_PER_TREE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_PER_TREE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    trees: int
    tokens: int
    bytes: int
    budget_tokens: int
    budget_bytes: int
    budget_tokens_per_tree: int
    budget_bytes_per_tree: int
    def __init__(self, kind: _Optional[str] = ..., trees: _Optional[int] = ..., tokens: _Optional[int] = ..., bytes: _Optional[int] = ..., budget_tokens: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., budget_tokens_per_tree: _Optional[int] = ..., budget_bytes_per_tree: _Optional[int] = ...) -> None: ...

class DropNamespaceRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class DropNamespaceResponse(_message.Message):
    __slots__ = ("found", "sessions", "sequences", "documents")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    found: bool
    sessions: int
    sequences: int
    documents: int
    def __init__(self, found: _Optional[bool] = ..., sessions: _Optional[int] = ..., sequences: _Optional[int] = ..., documents: _Optional[int] = ...) -> None: ...
