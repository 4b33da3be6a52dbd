// What a template can call: Jinja's filters and tests that chat templates use, the methods of
// strings and dicts they call (Python's), and the globals Hugging Face gives them.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engines/chat_template/value.h"

namespace warmpool::chat {

// Counts work a filter does per item (the renderer's step budget); false: over budget.
using StepFn = std::function<bool(uint64_t)>;

Result<Value> ApplyFilter(std::string_view name, const Value& value, const Args& args, const StepFn& step);
Result<bool> ApplyTest(std::string_view name, const Value& value, const Args& args);
// value.name: a dict's entry, a namespace's attribute, or a bound method of a string or dict;
// undefined when there is none.
Value Attribute(const Value& value, std::string_view name);
// raise_exception, range, namespace, dict, strftime_now; undefined for any other name.
Value Global(std::string_view name);

// Helpers the filters share with the methods: the i-th positional argument or the keyword one
// (undefined when neither is given); a string's or a dict's method called; a value's items as a
// for loop sees them (a dict's keys, a string's characters).
const Value& Arg(const Args& args, size_t i, std::string_view keyword);
Result<Value> CallMethod(const Value& value, std::string_view name, const Args& args);
Result<List> Items(const Value& value);

// Code points of a UTF-8 string, as byte offsets (Python indexes and slices strings by them).
std::vector<size_t> CodePoints(const std::string& s);

}  // namespace warmpool::chat
