from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CorpusUnit(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, segments: _Optional[_Iterable[str]] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("path", "content_hash", "first", "last", "units", "size", "kind", "offset")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    path: str
    content_hash: str
    first: bool
    last: bool
    units: _containers.RepeatedCompositeFieldContainer[CorpusUnit]
    size: int
    kind: str
    offset: int
    def __init__(self, path: _Optional[str] = ..., content_hash: _Optional[str] = ..., first: _Optional[bool] = ..., last: _Optional[bool] = ..., units: _Optional[_Iterable[_Union[CorpusUnit, _Mapping]]] = ..., size: _Optional[int] = ..., kind: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class WarmRequest(_message.Message):
    __slots__ = ("namespace", "chunks")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    chunks: _containers.RepeatedCompositeFieldContainer[FileChunk]
    def __init__(self, namespace: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[FileChunk, _Mapping]]] = ...) -> None: ...

class WarmReply(_message.Message):
    __slots__ = ("units", "tokens", "completed", "replaced_sequences")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    REPLACED_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    units: int
    tokens: int
    completed: _containers.RepeatedScalarFieldContainer[str]
    replaced_sequences: int
    def __init__(self, units: _Optional[int] = ..., tokens: _Optional[int] = ..., completed: _Optional[_Iterable[str]] = ..., replaced_sequences: _Optional[int] = ...) -> None: ...

class FileRef(_message.Message):
    __slots__ = ("path", "content_hash")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    path: str
    content_hash: str
    def __init__(self, path: _Optional[str] = ..., content_hash: _Optional[str] = ...) -> None: ...

class CheckFilesRequest(_message.Message):
    __slots__ = ("namespace", "files")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    files: _containers.RepeatedCompositeFieldContainer[FileRef]
    def __init__(self, namespace: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileRef, _Mapping]]] = ...) -> None: ...

class CheckFilesResponse(_message.Message):
    __slots__ = ("warm",)
    WARM_FIELD_NUMBER: _ClassVar[int]
    warm: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, warm: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveFilesRequest(_message.Message):
    __slots__ = ("namespace", "paths")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveFilesResponse(_message.Message):
    __slots__ = ("files", "sequences")
    FILES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    files: int
    sequences: int
    def __init__(self, files: _Optional[int] = ..., sequences: _Optional[int] = ...) -> None: ...

class ListFilesRequest(_message.Message):
    __slots__ = ("namespace", "prefix")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    prefix: str
    def __init__(self, namespace: _Optional[str] = ..., prefix: _Optional[str] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("path", "content_hash", "complete", "sequences", "tokens", "warmed_at", "size", "kind", "units")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WARMED_AT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    path: str
    content_hash: str
    complete: bool
    sequences: int
    tokens: int
    warmed_at: float
    size: int
    kind: str
    units: int
    def __init__(self, path: _Optional[str] = ..., content_hash: _Optional[str] = ..., complete: _Optional[bool] = ..., sequences: _Optional[int] = ..., tokens: _Optional[int] = ..., warmed_at: _Optional[float] = ..., size: _Optional[int] = ..., kind: _Optional[str] = ..., units: _Optional[int] = ...) -> None: ...

class ListFilesResponse(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileInfo]
    def __init__(self, files: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ...) -> None: ...
