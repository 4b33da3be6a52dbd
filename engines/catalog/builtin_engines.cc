#include "engines/catalog/builtin_engines.h"

#include "engines/transformer/cpu_model.h"

namespace warmpool {

const wp_engine_vtable* FindBuiltinEngine(std::string_view name) {
  for (const wp_engine_vtable* vtable :
       {warmpool_engine_dense(), warmpool_engine_echo(), warmpool_engine_transformer()}) {
    if (name == vtable->name) return vtable;
  }
  return nullptr;
}

void WarmBuiltinEngines() { transformer::WarmCpuKernels(); }

}  // namespace warmpool
