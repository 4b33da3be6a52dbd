"""Finding and connecting to warmpoold's Unix socket, the way the ``warmpool`` CLI does.

The socket is, in order (client/client.cc, common/paths.cc):

1. the ``socket`` argument;
2. ``$WARMPOOL_SOCKET`` when set and not empty;
3. the daemon's own default, ``$XDG_RUNTIME_DIR/warmpool.sock`` (when XDG_RUNTIME_DIR is an
   absolute path) or else ``/tmp/warmpool-$UID.sock``, unless nothing is there while the system
   service's socket exists;
4. the system service's socket, ``/run/warmpool/warmpool.sock``.
"""

import array
import os
import socket

from ._errors import invalid_argument, unavailable

#: Where the system service listens (systemd/warmpool.socket).
SYSTEM_SOCKET_PATH = "/run/warmpool/warmpool.sock"

# sockaddr_un.sun_path holds 108 bytes with the terminating NUL.
_MAX_SOCKET_PATH_BYTES = 107


def user_socket_path(environ=None):
    """The daemon's default socket: $XDG_RUNTIME_DIR/warmpool.sock, else /tmp/warmpool-$UID.sock."""
    environ = os.environ if environ is None else environ
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return runtime + "/warmpool.sock"
    return f"/tmp/warmpool-{os.getuid()}.sock"


def default_socket_path(environ=None, system_socket=None):
    """The socket a client uses when none is given (see the module's docstring)."""
    environ = os.environ if environ is None else environ
    system_socket = SYSTEM_SOCKET_PATH if system_socket is None else system_socket
    env = environ.get("WARMPOOL_SOCKET", "")
    if env:
        return env
    own = user_socket_path(environ)
    # A daemon of this user's own first; else the system service's socket.
    if not os.access(own, os.F_OK) and os.access(system_socket, os.F_OK):
        return system_socket
    return own


def resolve_socket_path(socket_path):
    """socket_path as a str, or the default when it is None."""
    if socket_path is None:
        return default_socket_path()
    return os.fspath(socket_path)


def check_socket_path(path):
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH_BYTES:
        raise invalid_argument(
            f'socket path "{path}" is too long (at most {_MAX_SOCKET_PATH_BYTES} bytes); use a '
            "shorter path or a symlink to the socket"
        )


def connect_error(path, error):
    """The Unavailable raised when connecting to path failed with OSError error."""
    reason = error.strerror or str(error)
    return unavailable(
        f"cannot connect to warmpoold at {path}: {reason} (is it running? start it with "
        "'warmpoold', or pass socket= / set WARMPOOL_SOCKET)"
    )


def connect_blocking(path):
    """A connected blocking AF_UNIX stream socket, or Unavailable saying what to do."""
    check_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as error:
        sock.close()
        raise connect_error(path, error) from None
    return sock


def send_frame(sock, data, fds=(), progress=None):
    """Writes data whole to a blocking socket; fds (SCM_RIGHTS) go with its first byte.

    progress[0] counts the bytes written as they go, so that a caller interrupted in the middle
    (an exception out of a signal handler, a timeout) knows whether the stream is still at a
    frame boundary (0 bytes out) or holds part of a frame."""
    progress = [0] if progress is None else progress
    view = memoryview(data)
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        progress[0] += sock.sendmsg([view], ancillary, socket.MSG_NOSIGNAL)
    while progress[0] < len(view):
        progress[0] += sock.send(view[progress[0]:], socket.MSG_NOSIGNAL)
