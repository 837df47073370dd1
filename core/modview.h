/* modview.h — one linear module of a checkpoint, found and checked: the engine-neutral view
 * that every engine builds its own weights from.
 *
 * td_module_view_get() resolves `module` (e.g. "model.layers.3.mlp.experts.7.down_proj")
 * through the quantization metadata (core/quant.h) and checks what the checkpoint holds for a
 * [rows, cols] linear layer (rows = output features):
 * - unquantized (TD_SCHEME_NONE): one BF16/F16/F32 tensor of shape [rows, cols];
 * - NVFP4 (ModelOpt or compressed-tensors): cols a multiple of 16, packed E2M1 U8
 *   [rows, cols/2], E4M3 block scales [rows, cols/16], an F32 scalar global.
 * Errors: TD_ERR_FORMAT naming the tensor, its dtype and shape and what was expected;
 * TD_ERR_UNSUPPORTED for another scheme (naming the module and scheme); a missing tensor is the
 * safetensors reader's error. The view points into the mapped shards: valid while `set` is
 * open, owned by nobody. Pure lookup, thread-safe for distinct outputs.
 */
#ifndef TD_MODVIEW_H
#define TD_MODVIEW_H

#include "nvfp4.h"
#include "quant.h"
#include "safetensors.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct td_module_view {
    bool nvfp4;
    int64_t rows, cols;
    td_dtype dtype;             /* dense: BF16, F16 or F32 */
    const void *w;              /* dense elements, or packed E2M1 bytes (element 2j low nibble) */
    const uint8_t *scales;      /* NVFP4: E4M3 block scales [rows, cols/16] */
    float global;               /* NVFP4: the stored global */
    td_nvfp4_conv conv;         /* NVFP4: how the global is applied */
} td_module_view;

td_status td_module_view_get(td_st_set *set, const td_quant *q, const char *module, int64_t rows, int64_t cols,
                             td_module_view *out, td_err *err);

#endif /* TD_MODVIEW_H */
