"""Length-prefixed framing (ipc/framing.h): a 4-byte little-endian length N, then N bytes of one
serialized warmpool.v1.Envelope. The receiver checks N against its limit as soon as the prefix is
in, before it buffers any of the body.
"""

import struct

from ._errors import resource_exhausted, unavailable

PREFIX_BYTES = 4
#: The protocol's own bound: a length must fit in 32 bits.
PROTOCOL_MAX_FRAME_BYTES = 0xFFFFFFFF
#: The daemon's default ``[limits] max_frame_bytes`` (frames it accepts).
DAEMON_DEFAULT_MAX_FRAME_BYTES = 64 << 20
PROTOCOL_VERSION = 1

_PREFIX = struct.Struct("<I")


def encode_frame(body):
    """The frame of one serialized message (bytes-like)."""
    if len(body) > PROTOCOL_MAX_FRAME_BYTES:
        raise ValueError(
            f"a message of {len(body)} bytes does not fit in a frame (at most "
            f"{PROTOCOL_MAX_FRAME_BYTES}); send large tensors through a shared-memory region"
        )
    return _PREFIX.pack(len(body)) + bytes(body)


class FrameDecoder:
    """Reassembles frame bodies from a byte stream that arrives in arbitrary pieces.

    ``feed`` buffers bytes; ``next_frame`` returns the next complete body or None. A length above
    ``max_frame_bytes`` raises ResourceExhausted as soon as its prefix is in, and every later call
    raises it again (the stream cannot be resynchronised).
    """

    def __init__(self, max_frame_bytes=PROTOCOL_MAX_FRAME_BYTES):
        if not 0 <= max_frame_bytes <= PROTOCOL_MAX_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be within 0..{PROTOCOL_MAX_FRAME_BYTES}")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._error = None

    def feed(self, data):
        if self._error is not None:
            raise self._error
        self._buffer += data
        self._check_prefix()

    def next_frame(self):
        """The next complete frame's body (bytes), or None when none is complete yet."""
        if self._error is not None:
            raise self._error
        if len(self._buffer) < PREFIX_BYTES:
            return None
        (length,) = _PREFIX.unpack_from(self._buffer)
        end = PREFIX_BYTES + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[PREFIX_BYTES:end])
        del self._buffer[:end]  # O(1) at the front of a bytearray
        self._check_prefix()
        return body

    def missing(self):
        """Bytes still needed to complete the frame being received (at least 1 at a boundary)."""
        if len(self._buffer) < PREFIX_BYTES:
            return PREFIX_BYTES - len(self._buffer)
        (length,) = _PREFIX.unpack_from(self._buffer)
        return max(1, PREFIX_BYTES + length - len(self._buffer))

    @property
    def buffered(self):
        """Bytes of an incomplete frame held (0 at a frame boundary)."""
        return len(self._buffer)

    def end_of_stream_error(self):
        """The Unavailable error for the peer closing the stream now."""
        if not self._buffer:
            return unavailable("warmpoold closed the connection")
        if len(self._buffer) < PREFIX_BYTES:
            return unavailable(
                f"warmpoold closed the connection in the middle of a frame's length prefix "
                f"({len(self._buffer)} of {PREFIX_BYTES} bytes)"
            )
        (length,) = _PREFIX.unpack_from(self._buffer)
        return unavailable(
            f"warmpoold closed the connection in the middle of a frame "
            f"({len(self._buffer) - PREFIX_BYTES} of {length} bytes received)"
        )

    def _check_prefix(self):
        if len(self._buffer) < PREFIX_BYTES:
            return
        (length,) = _PREFIX.unpack_from(self._buffer)
        if length > self.max_frame_bytes:
            self._error = resource_exhausted(
                f"warmpoold sent a frame of {length} bytes, more than this client's limit of "
                f"{self.max_frame_bytes} (raise max_frame_bytes to accept it)"
            )
            self._buffer.clear()
            raise self._error
