"""Python client of warmpoold, the warmpool local multi-model inference supervisor.

    import warmpool, numpy as np
    with warmpool.Client() as c:                  # the socket is found as the CLI finds it
        print(c.infer("tiny", np.ones((2, 16), np.float32)))

Client is blocking (one connection, pipelining with send_infer/wait and infer_many);
AsyncClient is its asyncio counterpart. Errors from the daemon raise WarmpoolError subclasses
named after their codes (NotFound, InvalidArgument, ...); str(error) is "CODE: message".
"""

from ._errors import (
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
    WarmpoolError,
)
from ._framing import DAEMON_DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION
from ._requests import keep_alive_ms
from ._socket import SYSTEM_SOCKET_PATH, default_socket_path, user_socket_path
from ._generation import Generation
from ._typed import BF16
from .aio import AsyncClient
from .client import Client
from .results import (
    DeviceStatus,
    FailedModel,
    EmbedResult,
    GenerateChunk,
    TokenLogprob,
    ToolCall,
    GenerateResult,
    LoadingModel,
    LoadResult,
    ModelInfo,
    PsEntry,
    RegisterResult,
    Status,
    WorkerStatus,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BF16",
    "Client",
    "DAEMON_DEFAULT_MAX_FRAME_BYTES",
    "DeadlineExceeded",
    "DeviceStatus",
    "FailedModel",
    "FailedPrecondition",
    "EmbedResult",
    "GenerateChunk",
    "TokenLogprob",
    "ToolCall",
    "GenerateResult",
    "Generation",
    "Internal",
    "InvalidArgument",
    "LoadResult",
    "LoadingModel",
    "ModelInfo",
    "NotFound",
    "PROTOCOL_VERSION",
    "PermissionDenied",
    "PsEntry",
    "RegisterResult",
    "ResourceExhausted",
    "SYSTEM_SOCKET_PATH",
    "Status",
    "Unavailable",
    "WarmpoolError",
    "WorkerStatus",
    "default_socket_path",
    "keep_alive_ms",
    "user_socket_path",
]
