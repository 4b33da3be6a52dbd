// The one table of error codes: for each Code its wire value (v1::Code, the same number), its name
// (as the CLI prints it, in HTTP bodies, and the proto's value name), the HTTP status the API
// answers with, and the CLI's exit status. Python's exception class is the name in CamelCase
// (NOT_FOUND -> NotFound).
//
// What keeps the copies elsewhere honest:
//   - v1::Code (ipc/warmpool.proto): same numbers and names; tests/unit/wire_tables_test.cc walks the
//     enum's descriptor both ways, and ipc/error_proto.h pins its range at compile time.
//   - CodeName (common/status.cc, below ipc in the link order, so it keeps its own switch): the same
//     test compares it with `name` for every row.
//   - http::StatusFor (http/response.cc) reads `http_status` from here.
//   - the Python exceptions (python/warmpool/_errors.py) are built from the proto's names at import
//     and refuse to import on a mismatch; tests/python/test_wire_tables.py checks them.
//
// This header needs only common/: the HTTP layer reads it without linking protobuf (the
// warmpool_codes target, ipc/CMakeLists.txt).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "common/status.h"

namespace warmpool::ipc {

struct CodeRow {
  Code code;
  std::string_view name;  // the v1::Code value name; Status::ToString's prefix
  int http_status;        // what the HTTP API answers an error of this code with
  // What the `warmpool` CLI exits with when a command fails with this code: a caller's mistake
  // (2, like a usage error) apart from a refusal or failure of the daemon (1).
  int cli_exit;
};

// Indexed by the code's value: kCodeTable[int(code)].code == code (asserted below).
inline constexpr std::array<CodeRow, 9> kCodeTable = {{
    {Code::kOk, "OK", 200, 0},
    {Code::kNotFound, "NOT_FOUND", 404, 1},
    {Code::kInvalidArgument, "INVALID_ARGUMENT", 400, 2},
    // 429, not 507: the client should retry later (a budget or queue frees up), as with gRPC.
    {Code::kResourceExhausted, "RESOURCE_EXHAUSTED", 429, 1},
    {Code::kUnavailable, "UNAVAILABLE", 503, 1},
    {Code::kDeadlineExceeded, "DEADLINE_EXCEEDED", 504, 1},
    {Code::kFailedPrecondition, "FAILED_PRECONDITION", 409, 1},
    {Code::kPermissionDenied, "PERMISSION_DENIED", 403, 1},
    {Code::kInternal, "INTERNAL", 500, 1},
}};

constexpr bool CodeTableIsIndexed() {
  for (size_t i = 0; i < kCodeTable.size(); i++) {
    if (static_cast<size_t>(kCodeTable[i].code) != i) return false;
  }
  return true;
}
static_assert(CodeTableIsIndexed(), "kCodeTable rows must be in the order of their values, none missing");
static_assert(kCodeTable.size() == static_cast<size_t>(Code::kInternal) + 1,
              "a Code without a row in kCodeTable (kInternal is the largest value)");

// The row of a code; a value outside the enum (a cast from an unchecked int) gets INTERNAL's, as
// CodeFromInt maps it.
constexpr const CodeRow& RowOf(Code code) {
  const auto i = static_cast<size_t>(code);
  return i < kCodeTable.size() ? kCodeTable[i] : kCodeTable[static_cast<size_t>(Code::kInternal)];
}

constexpr int HttpStatusOf(Code code) { return RowOf(code).http_status; }
constexpr int CliExitOf(Code code) { return RowOf(code).cli_exit; }

}  // namespace warmpool::ipc
