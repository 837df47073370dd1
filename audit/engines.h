/* engines.h — the engines built into this binary.
 *
 * core/engine.h defines the engine contract and the registry of engine *names* and the options
 * each accepts (so variants parse on any build). This module, one layer up, binds those names
 * to the implementations this binary contains (ref/ always; cuda/ when built with nvcc), so
 * that core/ depends on no engine and dependencies flow cli -> audit -> {ref, cuda} -> core.
 *
 * Contract
 * - td_engine_impl(name, &why) returns the engine's ops, or NULL with *why (static text) saying
 *   why it is missing (unknown name, or not built into this binary).
 * - td_engine_load() validates the variant against the registry, loads the checkpoint with the
 *   engine's ops and returns an engine the caller frees with td_engine_free(). Errors name the
 *   variant, the engine and the option or tensor at fault.
 * - td_engine_device_record() writes an engine's device facts into a run of the results store.
 * - Pure lookups; thread-safe.
 */
#ifndef TD_ENGINES_H
#define TD_ENGINES_H

#include "engine.h"

#include <stdint.h>

struct td_db;

const td_engine_ops *td_engine_impl(const char *name, const char **why);
td_status td_engine_load(const char *checkpoint, const td_variant *v, td_engine **out, td_err *err);
/* Record the GPU an engine ran on (td_engine_device) in run `run` of the results store: its
 * name, driver and CUDA version, empty fields left as they are; nothing when d names no GPU
 * (a CPU engine). */
td_status td_engine_device_record(struct td_db *db, int64_t run, const td_engine_device *d, td_err *err);

#endif /* TD_ENGINES_H */
