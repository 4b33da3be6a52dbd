"""The client's exception table agrees with the proto (warmpool.v1.Code), and so do the daemon's
table of codes (ipc/codes.h) and the one in docs/protocol.md. tests/unit/wire_tables_test.cc holds
the daemon's side (CodeName, HTTP statuses, the wire) against the same proto."""

import os
import re
import types

import pytest

import warmpool
from warmpool import _errors
from warmpool._proto import pb

from conftest import REPO

# {Code::kNotFound, "NOT_FOUND", 404, 1},
_CPP_ROW = re.compile(r'\{Code::k(\w+), "(\w+)", (\d+), (\d+)\}')
# | `NOT_FOUND` | 1 | 404 | `NotFound` | when ... |
_DOC_ROW = re.compile(r"^\| `([A-Z_]+)` \| (\d+) \| (\d+) \| `(\w+)` \|", re.MULTILINE)


def _proto_codes():
    return {number: name for name, number in pb.Code.items()}


def _cpp_rows():
    with open(os.path.join(REPO, "ipc", "codes.h"), encoding="utf-8") as f:
        rows = _CPP_ROW.findall(f.read())
    assert rows, "no rows found in ipc/codes.h: has the table's format changed? (update _CPP_ROW)"
    return rows


def test_every_proto_code_but_ok_has_its_exception():
    codes = _proto_codes()
    assert codes[0] == "OK"
    assert set(_errors._BY_NUMBER) == set(codes) - {0}
    for number, (name, cls) in _errors._BY_NUMBER.items():
        assert name == codes[number]
        assert cls.__name__ == _errors.class_name(name)
        assert _errors._BY_NAME[name] is cls
        # Users import the classes from the package and read what each means.
        assert getattr(warmpool, cls.__name__) is cls and cls.__name__ in warmpool.__all__
        assert cls.__doc__.startswith(f"{name}: "), cls.__doc__
        by_number = _errors.error_from_code(number, "why")
        assert type(by_number) is cls and str(by_number) == f"{name}: why"
        assert type(_errors.error_from_code(name, "why")) is cls


def test_unknown_codes_are_internal_like_the_cpp_client():
    assert type(_errors.error_from_code(max(_proto_codes()) + 1, "m")) is warmpool.Internal
    assert type(_errors.error_from_code("NO_SUCH_CODE", "m")) is warmpool.Internal


def test_the_daemons_table_has_the_proto_numbers_and_names():
    rows = _cpp_rows()
    codes = _proto_codes()
    assert list(range(len(rows))) == sorted(codes)
    for number, (camel, name, _http, _exit) in enumerate(rows):
        assert codes[number] == name
        assert camel == _errors.class_name(name)  # Code::kNotFound is NotFound, like the exception


def test_the_documented_table_is_the_daemons():
    with open(os.path.join(REPO, "docs", "protocol.md"), encoding="utf-8") as f:
        documented = _DOC_ROW.findall(f.read())
    assert documented, "docs/protocol.md has no table of error codes"
    expected = [(name, str(number), http, _errors.class_name(name))
                for number, (_camel, name, http, _exit) in enumerate(_cpp_rows()) if name != "OK"]
    assert documented == expected


def _fake_proto(monkeypatch, codes):
    enum = types.SimpleNamespace(items=lambda: list(codes.items()))
    monkeypatch.setattr(_errors, "pb", types.SimpleNamespace(Code=enum))


def test_a_proto_code_without_a_class_fails_the_import(monkeypatch):
    codes = dict(pb.Code.items())
    codes["DATA_LOSS"] = max(codes.values()) + 1
    _fake_proto(monkeypatch, codes)
    with pytest.raises(ImportError, match="DATA_LOSS .* no exception class DataLoss"):
        _errors._table()


def test_a_class_without_a_proto_code_fails_the_import(monkeypatch):
    orphan = type("Cancelled", (_errors.WarmpoolError,), {"__module__": _errors.__name__})
    monkeypatch.setitem(_errors.__dict__, "Cancelled", orphan)
    with pytest.raises(ImportError, match="without a code .*Cancelled"):
        _errors._table()
