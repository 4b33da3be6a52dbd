// Deliberately broken engine plugins for plugin_loader_test, one per BROKEN_* definition:
//   BROKEN_NO_SYMBOL    exports no warmpool_engine
//   BROKEN_OLD_ABI      a vtable of ABI version 1
//   BROKEN_EMPTY_ENTRY  a vtable whose attach entry point is null
//   BROKEN_WRONG_NAME   a vtable named "other"
//   BROKEN_NULL_VTABLE  warmpool_engine() returns null
#include "warmpool/engine.h"

namespace {

wp_status Open(const wp_engine_spec*, const wp_device_memory*, wp_engine**, wp_engine_info*, char*, size_t) {
  return WP_INTERNAL;
}
wp_status Load(wp_engine*, wp_progress_fn, void*, char*, size_t) { return WP_INTERNAL; }
wp_status Infer(wp_engine*, const float*, uint32_t, uint32_t, float*, char*, size_t) { return WP_INTERNAL; }
void Close(wp_engine*) {}
wp_status Export(wp_engine*, wp_region*) { return WP_NOT_FOUND; }
[[maybe_unused]] wp_status Attach(wp_engine*, const wp_region*, char*, size_t) { return WP_INTERNAL; }

#if defined(BROKEN_OLD_ABI)
[[maybe_unused]] const wp_engine_vtable kVtable = {1u, BROKEN_ENGINE_NAME, &Open, &Load, &Infer, &Close, &Export, &Attach,
                                                   nullptr, nullptr, nullptr, nullptr, nullptr};
#elif defined(BROKEN_EMPTY_ENTRY)
[[maybe_unused]] const wp_engine_vtable kVtable = {WP_ENGINE_ABI_VERSION, BROKEN_ENGINE_NAME, &Open, &Load, &Infer, &Close, &Export,
                                  nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
#else
[[maybe_unused]] const wp_engine_vtable kVtable = {WP_ENGINE_ABI_VERSION, BROKEN_ENGINE_NAME, &Open, &Load, &Infer, &Close, &Export,
                                  &Attach, nullptr, nullptr, nullptr, nullptr, nullptr};
#endif

}  // namespace

#if defined(BROKEN_NO_SYMBOL)
extern "C" __attribute__((visibility("default"))) const wp_engine_vtable* some_other_symbol(void) { return &kVtable; }
#elif defined(BROKEN_NULL_VTABLE)
extern "C" __attribute__((visibility("default"))) const wp_engine_vtable* warmpool_engine(void) { return nullptr; }
#else
extern "C" __attribute__((visibility("default"))) const wp_engine_vtable* warmpool_engine(void) { return &kVtable; }
#endif
