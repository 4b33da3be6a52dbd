"""Typed exceptions for the daemon's error codes (warmpool.v1.Code).

Every error the daemon answers becomes a :class:`WarmpoolError` subclass named after its code;
``str(error)`` is ``CODE: message``, the same text the ``warmpool`` CLI prints after ``error:``.
Connection failures (no daemon, a closed connection, a broken frame) raise :class:`Unavailable`.
"""


class WarmpoolError(Exception):
    """An error answered by warmpoold, or a failure to talk to it.

    Attributes:
        code: the error code's name, e.g. ``"NOT_FOUND"``.
        message: the daemon's (or the client's) explanation.
    """

    code = "UNKNOWN"

    def __init__(self, code, message):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self):
        return f"{self.code}: {self.message}"

    def __repr__(self):
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


class NotFound(WarmpoolError):
    """NOT_FOUND: e.g. a model that is not registered."""


class InvalidArgument(WarmpoolError):
    """INVALID_ARGUMENT: e.g. an input whose width is not the model's."""


class ResourceExhausted(WarmpoolError):
    """RESOURCE_EXHAUSTED: a budget, queue or frame limit was reached."""


class Unavailable(WarmpoolError):
    """UNAVAILABLE: the daemon cannot be reached, closed the connection, or is stopping."""


class DeadlineExceeded(WarmpoolError):
    """DEADLINE_EXCEEDED: the request's deadline passed before it was answered."""


class FailedPrecondition(WarmpoolError):
    """FAILED_PRECONDITION: e.g. fault injection on a daemon started without it."""


class PermissionDenied(WarmpoolError):
    """PERMISSION_DENIED: the request needs an admin (root, the daemon's user, [access] admin_group)."""


class Internal(WarmpoolError):
    """INTERNAL: a bug, or a reply this client cannot make sense of."""


# Index = the wire value of warmpool.v1.Code (OK = 0 has no exception).
_BY_NUMBER = {
    1: ("NOT_FOUND", NotFound),
    2: ("INVALID_ARGUMENT", InvalidArgument),
    3: ("RESOURCE_EXHAUSTED", ResourceExhausted),
    4: ("UNAVAILABLE", Unavailable),
    5: ("DEADLINE_EXCEEDED", DeadlineExceeded),
    6: ("FAILED_PRECONDITION", FailedPrecondition),
    7: ("PERMISSION_DENIED", PermissionDenied),
    8: ("INTERNAL", Internal),
}
_BY_NAME = {name: cls for name, cls in _BY_NUMBER.values()}


def error_from_code(code, message):
    """The exception for a wire code (int) or code name (str); unknown codes become Internal,
    as the C++ client treats them."""
    if isinstance(code, str):
        cls = _BY_NAME.get(code)
        if cls is None:
            return Internal("INTERNAL", f"{message} (unknown error code {code})")
        return cls(code, message)
    entry = _BY_NUMBER.get(int(code))
    if entry is None:
        return Internal("INTERNAL", f"{message} (unknown error code {int(code)})")
    name, cls = entry
    return cls(name, message)


def fresh(error):
    """A new exception equal to error, to raise again (a connection's error is raised at every
    later call, and each raise should carry its own traceback)."""
    if isinstance(error, WarmpoolError):
        return type(error)(error.code, error.message)
    return unavailable(str(error))


def unavailable(message):
    return Unavailable("UNAVAILABLE", message)


def internal(message):
    return Internal("INTERNAL", message)


def invalid_argument(message):
    return InvalidArgument("INVALID_ARGUMENT", message)


def resource_exhausted(message):
    return ResourceExhausted("RESOURCE_EXHAUSTED", message)
