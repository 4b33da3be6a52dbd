"""Every request of the protocol as an Envelope (client/requests.cc), and the option values they
take. The request_id and protocol_version are set by the client when it sends."""

import datetime
import math
import os
import re

from ._proto import pb
from ._tensors import fill_tensor

_UINT32_MAX = 0xFFFFFFFF
_DURATION = re.compile(r"([0-9.]+)(ms|s|m|h)?")
_DURATION_SCALE_MS = {None: 1000, "s": 1000, "ms": 1, "m": 60000, "h": 3600000}


def _duration_error(text):
    return ValueError(
        f'duration "{text}" must be a number with an optional unit (ms, s, m, h), e.g. 5m, or '
        "-1 for forever"
    )


def keep_alive_ms(value):
    """keep_alive as the protocol's milliseconds, or None for the model's configured keep_alive.

    Accepts what ``warmpool load --keep-alive`` accepts: ``"250ms"``, ``"30s"``, ``"5m"``,
    ``"1.5h"``, ``"90"`` (seconds), ``"0"`` (release as soon as idle), ``"-1"`` (until evicted);
    or a number of seconds (int or float; -1 for until evicted), or a datetime.timedelta.
    """
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        if value == "-1":
            return -1
        match = _DURATION.fullmatch(value)
        if match is None:
            raise _duration_error(value)
        try:
            number = float(match.group(1))
        except ValueError:
            raise _duration_error(value) from None
        ms = number * _DURATION_SCALE_MS[match.group(2)]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if value == -1:
            return -1
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"keep_alive {value!r} must be seconds >= 0, or -1 to keep the model until evicted"
            )
        ms = value * 1000.0
    else:
        raise TypeError(
            f"keep_alive must be seconds (a number), a duration string such as '5m', a "
            f"timedelta or None, not {type(value).__name__}"
        )
    if not math.isfinite(ms) or ms > 1e15:
        raise ValueError(f"keep_alive {value!r} is too long")
    return int(math.floor(ms + 0.5))


def _uint32(name, value, minimum=0):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not minimum <= value <= _UINT32_MAX:
        raise ValueError(f"{name} {value} is outside {minimum}..{_UINT32_MAX}")
    return value


def _name(what, value):
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def load(model, replicas=None, keep_alive=None):
    envelope = pb.Envelope()
    request = envelope.load
    request.model = _name("model", model)
    request.replicas = 0 if replicas is None else _uint32("replicas", replicas, minimum=1)
    ms = keep_alive_ms(keep_alive)
    if ms is not None:
        request.keep_alive_ms = ms
    return envelope


def unload(model, park=False):
    envelope = pb.Envelope()
    envelope.unload.model = _name("model", model)
    envelope.unload.park = bool(park)
    return envelope


def unload_all():
    envelope = pb.Envelope()
    envelope.unload.all = True
    return envelope


def _infer_options(request, deadline_ms, keep_alive):
    request.deadline_ms = 0 if deadline_ms is None else _uint32("deadline_ms", deadline_ms)
    ms = keep_alive_ms(keep_alive)
    if ms is not None:
        request.keep_alive_ms = ms


def infer(model, matrix, deadline_ms=None, keep_alive=None):
    """matrix: from _tensors.as_input_matrix."""
    envelope = pb.Envelope()
    request = envelope.infer
    request.model = _name("model", model)
    fill_tensor(request.input, matrix)
    _infer_options(request, deadline_ms, keep_alive)
    return envelope


def infer_in_region(model, rows, cols, region, input_offset, output_offset, output_bytes,
                    deadline_ms=None, keep_alive=None):
    """Inference on an input of rows x cols f32 at input_offset of a registered region; the
    output goes at output_offset when it fits in output_bytes (else it comes in the reply)."""
    envelope = pb.Envelope()
    request = envelope.infer
    request.model = _name("model", model)
    request.input.rows = rows
    request.input.cols = cols
    request.input_region.region = region
    request.input_region.offset = input_offset
    request.input_region.bytes = rows * cols * 4
    if output_bytes:
        request.output_region.region = region
        request.output_region.offset = output_offset
        request.output_region.bytes = output_bytes
    _infer_options(request, deadline_ms, keep_alive)
    return envelope


def region(bytes_):
    """Registers a region; its memfd travels with the frame."""
    envelope = pb.Envelope()
    envelope.region.bytes = bytes_
    return envelope


def region_remove(region_id):
    envelope = pb.Envelope()
    envelope.region.remove = region_id
    return envelope


def pin(model, pinned=True):
    envelope = pb.Envelope()
    envelope.pin.model = _name("model", model)
    envelope.pin.pin = bool(pinned)
    return envelope


def register(model, path, engine=None):
    envelope = pb.Envelope()
    request = envelope.register_model
    request.model = _name("model", model)
    # The daemon has its own working directory: send the path absolute (normalised, symlinks
    # unresolved: the daemon resolves them against its model roots), as the CLI does.
    request.path = os.path.abspath(os.fspath(path))
    request.engine = "" if engine is None else _name("engine", engine)
    return envelope


def unregister(model):
    envelope = pb.Envelope()
    envelope.register_model.model = _name("model", model)
    envelope.register_model.remove = True
    return envelope


def fault_arm(point, action, model=None, after=0, times=0):
    envelope = pb.Envelope()
    request = envelope.fault_arm
    request.point = _name("point", point)
    request.action = _name("action", action)
    request.model = "" if model is None else _name("model", model)
    request.after = _uint32("after", after)
    request.times = _uint32("times", times)
    return envelope


def fault_clear():
    envelope = pb.Envelope()
    envelope.fault_clear.SetInParent()
    return envelope


def models():
    envelope = pb.Envelope()
    envelope.models.SetInParent()
    return envelope


def ps():
    envelope = pb.Envelope()
    envelope.ps.SetInParent()
    return envelope


def status():
    envelope = pb.Envelope()
    envelope.status.SetInParent()
    return envelope
