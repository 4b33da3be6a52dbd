"""Typed exceptions for the daemon's error codes (warmpool.v1.Code).

Every error the daemon answers becomes a :class:`WarmpoolError` subclass named after its code;
``str(error)`` is ``CODE: message``, the same text the ``warmpool`` CLI prints after ``error:``.
Connection failures (no daemon, a closed connection, a broken frame) raise :class:`Unavailable`.

The classes are written out (users import them by name and read their docstrings); which number
and name each answers to comes from the generated proto module, and importing fails when the two
disagree.
"""

from ._proto import pb


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


def class_name(code_name):
    """The exception class of a code: its proto name in CamelCase (NOT_FOUND -> NotFound)."""
    return "".join(word.capitalize() for word in code_name.split("_"))


def _table():
    """{wire number: (name, class)}, from the proto's enum (warmpool.v1.Code, the same enum the
    daemon's ipc/codes.h is tested against), so that a code added there cannot be missed here."""
    classes = {
        cls.__name__: cls
        for cls in globals().values()
        if isinstance(cls, type) and issubclass(cls, WarmpoolError) and cls is not WarmpoolError
        and cls.__module__ == __name__
    }
    by_number = {}
    for name, number in pb.Code.items():
        if name == "OK":  # success has no exception
            if number != 0:
                raise ImportError(f"warmpool.v1.Code.OK is {number}, not 0: the proto is not this client's")
            continue
        cls = classes.pop(class_name(name), None)
        if cls is None:
            raise ImportError(
                f"warmpool.v1.Code.{name} ({number}) has no exception class {class_name(name)} in "
                "warmpool/_errors.py: add one (ipc/codes.h lists every code)"
            )
        by_number[number] = (name, cls)
    if classes:
        raise ImportError(
            f"exception classes without a code in warmpool.v1.Code: {', '.join(sorted(classes))} "
            "(warmpool/_errors.py names each class after its code)"
        )
    return by_number


_BY_NUMBER = _table()
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
