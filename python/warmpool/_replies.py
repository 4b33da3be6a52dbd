"""Reply Envelopes as Python values (see results.py); an error reply raises its typed exception."""

from google.protobuf.message import DecodeError

from . import results
from ._errors import error_from_code, internal
from ._proto import pb
from ._tensors import matrix_from_tensor


def parse_envelope(body):
    """A received frame's body as an Envelope; Internal when it is not one."""
    envelope = pb.Envelope()
    try:
        envelope.ParseFromString(body)
    except DecodeError:
        raise internal(
            f"received a frame of {len(body)} bytes that is not a valid warmpool.v1.Envelope"
        ) from None
    return envelope


def _or_none(text):
    return text if text else None


_DTYPE_NAMES = {1: "f32", 2: "f16", 3: "bf16", 4: "i32", 5: "i64", 6: "bytes"}


def _specs(tensors):
    return {t.name: (_DTYPE_NAMES.get(t.dtype, str(t.dtype)), tuple(t.shape)) for t in tensors}


def _tensors(m):
    if not m.runs_tensors:
        return None
    any_tensors = not m.inputs and not m.outputs
    return {"inputs": None if any_tensors else _specs(m.inputs), "outputs": None if any_tensors else _specs(m.outputs)}


def model_info(m):
    return results.ModelInfo(
        name=m.name, engine=m.engine, path=m.path, state=m.state, bytes=m.bytes,
        in_features=m.in_features, out_features=m.out_features, error=_or_none(m.last_error),
        retry_in_ms=m.retry_in_ms, weight_bytes=m.weight_bytes, workspace_bytes=m.workspace_bytes,
        total_bytes=m.weight_bytes + m.workspace_bytes, pinned=m.pinned, file_broken=m.file_broken,
        tensors=_tensors(m), tool_call_format=_or_none(m.tool_call_format), parallel=m.parallel or None,
        embeds_only=m.embeds_only,
    )


def ps_entry(e):
    return results.PsEntry(
        name=e.name, state=e.state, device=e.device, bytes=e.bytes, inflight=e.inflight,
        replicas=e.replicas, last_used=e.last_used,
        expires_in=e.expires_in if e.has_expiry else None, loaded_bytes=e.loaded_bytes,
        error=_or_none(e.last_error), retry_in_ms=e.retry_in_ms,
        worker=e.worker if e.worker >= 0 else None, weight_bytes=e.weight_bytes, pinned=e.pinned,
        workspace_bytes=e.workspace_bytes, total_bytes=e.weight_bytes + e.workspace_bytes,
        file_broken=e.file_broken, prompt_tokens=e.prompt_tokens, cached_prompt_tokens=e.cached_prompt_tokens,
    )


def status(s):
    return results.Status(
        version=s.version, backend=s.backend, instance=s.instance,
        devices=[
            results.DeviceStatus(
                id=d.id, kind=d.kind, budget_bytes=d.budget_bytes, used_bytes=d.used_bytes,
                kept_bytes=d.kept_bytes, kept_regions=d.kept_regions, name=d.name,
                total_bytes=d.total_bytes,
            )
            for d in s.devices
        ],
        workers=[
            results.WorkerStatus(
                slot=w.slot, pid=w.pid, device=w.device, state=w.state, restarts=w.restarts,
                last_exit=_or_none(w.last_exit), models=list(w.models), outstanding=w.outstanding,
            )
            for w in s.workers
        ],
        inflight=s.inflight, queued=s.queued,
        failed=[results.FailedModel(m.name, m.last_error, m.retry_in_ms, m.file_broken) for m in s.failed],
        fault_injection=s.fault_injection,
        loading=[results.LoadingModel(e.name, e.loaded_bytes, e.weight_bytes) for e in s.loading],
    )


def raise_if_error(envelope):
    if envelope.HasField("error"):
        raise error_from_code(envelope.error.code, envelope.error.message)


def body(envelope, expected):
    """The reply's body message after checking it is the expected one (an error raises)."""
    raise_if_error(envelope)
    case = envelope.WhichOneof("body")
    if case != expected:
        raise internal(
            f"request {envelope.request_id}: expected a {expected} from warmpoold, got "
            f"{case or 'an empty reply'}"
        )
    return getattr(envelope, expected)


_DECODERS = {
    "load_reply": lambda r: results.LoadResult(
        r.model, r.bytes, r.load_ms, r.already_loaded, weight_bytes=r.weight_bytes,
        workspace_bytes=r.workspace_bytes, total_bytes=r.weight_bytes + r.workspace_bytes,
        replicas=r.replicas, replicas_before=r.replicas_before, replicas_asked=r.replicas_asked,
        replicas_capped=_or_none(r.replicas_capped), evicted=list(r.evicted),
    ),
    "unload_reply": lambda r: r.model,
    "infer_reply": lambda r: matrix_from_tensor(r.output),
    "models_reply": lambda r: [model_info(m) for m in r.models],
    "ps_reply": lambda r: [ps_entry(e) for e in r.models],
    "status_reply": status,
    "fault_arm_reply": lambda r: r.id,
    "fault_clear_reply": lambda r: r.cleared,
    "pin_reply": lambda r: r.pinned,
    "register_model_reply": lambda r: results.RegisterResult(
        r.model, r.path, r.weight_bytes, r.removed, r.replaced
    ),
    "region_reply": lambda r: r.region,
}


def decode(envelope):
    """Any reply as its Python value: what the matching Client method returns."""
    raise_if_error(envelope)
    case = envelope.WhichOneof("body")
    decoder = _DECODERS.get(case)
    if decoder is None:
        raise internal(
            f"request {envelope.request_id}: warmpoold sent {case or 'an empty reply'}, which "
            "this client does not understand"
        )
    return decoder(getattr(envelope, case))


def expect(envelope, expected):
    """The decoded reply, checked to be the expected kind."""
    return _DECODERS[expected](body(envelope, expected))
