// The engines compiled into warmpool. Their own folders hold them (engines/ the dense and echo
// engines, engines/transformer/ the transformer); this list is the one place that names them all.
#pragma once

#include <string_view>

#include "warmpool/engine.h"

namespace warmpool {

// "dense", "echo" or "transformer"; nullptr for any other name.
const wp_engine_vtable* FindBuiltinEngine(std::string_view name);
// What the built-in engines prepare once per process, before any model (a worker's start): code
// their first requests would otherwise wait for (engines/transformer/cpu_model.h WarmCpuKernels).
void WarmBuiltinEngines();

}  // namespace warmpool
