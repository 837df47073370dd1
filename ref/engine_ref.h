/* engine_ref.h — the scalar reference engine's entry point.
 *
 * td_ref_engine_ops implements the engine contract of core/engine.h for the `ref` engine
 * (MoE and router blocks; see docs/engine.md). Callers reach it through audit/engines.h
 * (td_engine_load with a `ref:...` variant); nothing else should name it directly.
 */
#ifndef TD_ENGINE_REF_H
#define TD_ENGINE_REF_H

#include "engine.h"

extern const td_engine_ops td_ref_engine_ops;

#endif /* TD_ENGINE_REF_H */
