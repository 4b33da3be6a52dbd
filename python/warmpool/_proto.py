"""The generated protocol module (warmpool_pb2, made by protoc from ipc/warmpool.proto when the
package is built), with an error that says what to do when it is missing."""

try:
    from . import warmpool_pb2 as pb
except ImportError as error:  # pragma: no cover - depends on how the package was obtained
    raise ImportError(
        "warmpool.warmpool_pb2 is missing: it is generated from ipc/warmpool.proto when the "
        "package is built. Install the package (pip install ./python from "
        "the repository root) rather than importing python/warmpool from the source tree."
    ) from error

__all__ = ["pb"]
