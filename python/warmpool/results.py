"""What the client's methods return: plain dataclasses whose field names follow the ``--json``
output of the ``warmpool`` CLI (``models``, ``ps``, ``status``), with None where the CLI prints
null. ``dataclasses.asdict(x)`` gives the CLI's JSON object."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass(frozen=True)
class ModelInfo:
    """A registered model (``warmpool models``)."""

    name: str
    engine: str
    path: str
    state: str  # e.g. "unloaded", "loading", "ready", "parked", "failed", "refused"
    bytes: int  # weights (the name older clients know; weight_bytes says it plainly)
    in_features: int  # 0: unknown until loaded, or any width (echo)
    out_features: int
    error: Optional[str]
    retry_in_ms: int  # failed: milliseconds until a request may load it again
    # Sizes are named the same everywhere: the weights (held once), every replica's workspace
    # (on a device; else what one replica will need), and their sum.
    weight_bytes: int = 0
    workspace_bytes: int = 0
    total_bytes: int = 0
    pinned: bool = False
    file_broken: bool = False  # failed because of its file: fix it, then load() reads it again
    # Typed tensors (infer_tensors), as `models --json` says: None until a worker opened it, or
    # when its engine takes none; else {"inputs": ..., "outputs": ...}, each name -> (dtype, shape)
    # with -1 for a size a request chooses, or None when it takes any.
    tensors: Optional[dict] = None
    # Language models that take tools: the format their calls are read in ("hermes", "llama3_json").
    tool_call_format: Optional[str] = None
    # Language models: generations each replica runs at once (continuous batching).
    parallel: Optional[int] = None
    # Language models that embed but do not generate (no output head): generate() is refused.
    embeds_only: bool = False


@dataclass(frozen=True)
class PsEntry:
    """A model loaded, loading, parked or failed (``warmpool ps``)."""

    name: str
    state: str  # loading | ready | parked | failed | unloading
    device: int
    bytes: int
    inflight: int
    replicas: int
    last_used: int  # unix seconds, 0 when never used
    expires_in: Optional[int]  # seconds; None: kept until evicted
    loaded_bytes: int
    error: Optional[str]
    retry_in_ms: int
    worker: Optional[int]  # slot of the worker holding it; None when none
    weight_bytes: int
    pinned: bool
    workspace_bytes: int = 0  # every replica's
    total_bytes: int = 0  # weight_bytes + workspace_bytes (what ``bytes`` has always been here)
    file_broken: bool = False
    # a language model's generations: their prompt tokens, and those found in its prefix cache
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class DeviceStatus:
    id: int
    kind: str  # "host" or "cuda"
    budget_bytes: int
    used_bytes: int
    kept_bytes: int
    kept_regions: int
    name: str
    total_bytes: int


@dataclass(frozen=True)
class WorkerStatus:
    slot: int
    pid: int
    device: int
    state: str  # starting | idle | busy | dead | fatal
    restarts: int
    last_exit: Optional[str]  # "killed by signal 9", "exited with status 1", or None
    models: List[str]
    outstanding: int  # jobs sent to it and not answered


@dataclass(frozen=True)
class FailedModel:
    name: str
    error: str
    retry_in_ms: int
    file_broken: bool = False


@dataclass(frozen=True)
class LoadingModel:
    name: str
    loaded_bytes: int
    weight_bytes: int


@dataclass(frozen=True)
class Status:
    """The daemon, its devices and workers (``warmpool status``)."""

    version: str
    backend: str
    instance: str  # names the shared-memory segment /dev/shm/warmpool.<instance>
    devices: List[DeviceStatus]
    workers: List[WorkerStatus]
    inflight: int
    queued: int
    failed: List[FailedModel]
    fault_injection: bool
    loading: List[LoadingModel] = field(default_factory=list)


@dataclass(frozen=True)
class LoadResult:
    """The answer to load(): the model is ready, and what the load did."""

    model: str
    bytes: int  # weights (older name)
    load_ms: int
    already_loaded: bool
    weight_bytes: int = 0
    workspace_bytes: int = 0
    total_bytes: int = 0
    replicas: int = 0  # serving or attaching now
    replicas_before: int = 0  # already_loaded: before this load
    replicas_asked: int = 0  # 0: not asked
    replicas_capped: Optional[str] = None  # why fewer replicas than asked
    evicted: List[str] = field(default_factory=list)  # released to make room for it


@dataclass(frozen=True)
class RegisterResult:
    """The answer to register() and unregister()."""

    model: str
    path: str  # resolved by the daemon
    weight_bytes: int
    removed: bool  # unregister: forgotten once its work ends
    replaced: bool  # a client-registered model of that name existed; it changes once idle


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model's own distribution (the log-softmax of its
    logits, before temperature, penalties and filters), its bytes (maybe part of a UTF-8
    character), and (for a generated token, when asked for) the most likely tokens' at that step."""

    token: int
    logprob: float
    piece: bytes
    top: List["TokenLogprob"] = field(default_factory=list)


@dataclass(frozen=True)
class ToolCall:
    """A call of a tool the request offered, read out of the model's text (in the format its chat
    template shows): ``arguments`` is the call's JSON object, parsed."""

    id: str
    name: str
    arguments: dict


@dataclass(frozen=True)
class GenerateChunk:
    """One step of a streamed generation: its text (never a split UTF-8 character; empty while
    one is incomplete) and the token ids it came from. ``index`` counts from 0."""

    index: int
    text: str
    tokens: List[int] = field(default_factory=list)
    logprobs: List[TokenLogprob] = field(default_factory=list)  # one per token, when asked for
    tool_calls: List[ToolCall] = field(default_factory=list)  # calls completed by this chunk


@dataclass(frozen=True)
class EmbedResult:
    """Embeddings: one list of ``dimensions`` floats per input, in order, each at unit length;
    ``tokens`` the token count of each input."""

    embeddings: List[List[float]]
    dimensions: int
    prompt_tokens: int
    tokens: List[int]
    embed_us: int


@dataclass(frozen=True)
class GenerateResult:
    """A generation's final reply. ``text`` and ``tokens`` hold everything generated when it was
    not streamed (streamed, they came in the chunks: Generation.text gathers them)."""

    # "stop" (an end token or a stop string), "length", "cancelled"; "tool_calls" after calling tools
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    first_token_us: int
    generate_us: int
    chunks: int
    text: str = ""
    tokens: List[int] = field(default_factory=list)
    logprobs: List[TokenLogprob] = field(default_factory=list)  # not streamed, when asked for
    tool_calls: List[ToolCall] = field(default_factory=list)  # not streamed: every call
    # of prompt_tokens, those found in the model's prefix cache (not computed again)
    cached_prompt_tokens: int = 0
