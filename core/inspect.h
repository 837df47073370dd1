/* inspect.h — describe a checkpoint and find inconsistencies (`tandem inspect`).
 *
 * td_inspect() opens a checkpoint directory (config.json, quantization metadata, index or
 * single safetensors file), builds the inventory the config implies (core/layout.h), resolves
 * each module's quantization scheme (core/quant.h) and checks every tensor the scheme names:
 * presence, dtype against the scheme (NVFP4: U8 packed, F8_E4M3 block scales, F32 globals;
 * unquantized: a float dtype), shape against the config (NVFP4: [out, in/2] and [out, in/16];
 * globals [] or [1]). For NVFP4 tensors it also reads the data that can carry silent damage:
 * block-scale bytes (NaN codes 0x7F/0xFF are errors, sign-bit codes are warnings) and the
 * global scales (must be finite and > 0). Tensors present but not implied by the config are
 * warnings (MTP and vision tensors are counted separately and not flagged).
 *
 * Contract
 * - Fatal problems (unreadable/malformed config, metadata, index or shard) return an error
 *   status with a message naming the file (and tensor). Everything else becomes a finding in
 *   the report; the report's n_errors says whether the checkpoint is consistent.
 * - The report owns its memory; free with td_inspect_report_free (NULL-safe).
 * - At most TD_INSPECT_MAX_FINDINGS findings are kept in detail; per-kind counts are exact.
 * - td_inspect_print writes the human report; td_inspect_json returns a malloc'd JSON string
 *   (caller frees with free()).
 */
#ifndef TD_INSPECT_H
#define TD_INSPECT_H

#include "config.h"
#include "quant.h"

#include <stdio.h>

#define TD_INSPECT_MAX_FINDINGS 200

typedef enum td_severity { TD_SEV_ERROR = 0, TD_SEV_WARN, TD_SEV_INFO } td_severity;

typedef enum td_finding_kind {
    TD_FIND_MISSING = 0,     /* tensor implied by config + scheme is absent */
    TD_FIND_SHAPE,           /* shape contradicts the config */
    TD_FIND_DTYPE,           /* dtype contradicts the quantization map */
    TD_FIND_NAN_SCALE,       /* NaN E4M3 code in a block scale */
    TD_FIND_NEG_SCALE,       /* sign bit set in a block scale */
    TD_FIND_BAD_GLOBAL,      /* global/input scale not finite or <= 0 */
    TD_FIND_UNEXPECTED,      /* tensor not implied by the config */
    TD_FIND_NOTE,            /* informational */
    TD_FIND_KIND_COUNT
} td_finding_kind;

typedef struct td_finding {
    td_severity sev;
    td_finding_kind kind;
    char tensor[192];
    char msg[320];
} td_finding;

typedef struct td_scheme_stat {
    int64_t modules, tensors, bytes;
} td_scheme_stat;

typedef struct td_inspect_report {
    char dir[1024];
    td_config cfg;
    td_quant quant;
    char prefix[64];
    int64_t n_tensors, total_bytes, n_shards;
    char **shards;                           /* [n_shards] file names */
    int64_t n_modules;
    td_scheme_stat schemes[TD_SCHEME_COUNT]; /* modules/tensors/bytes per scheme */
    int64_t other_tensors, other_bytes;      /* mtp.* and vision tensors */
    bool fused_experts;                      /* routed experts stored as 3-D tensors */
    int64_t nvfp4_scale_bytes_scanned;
    int64_t counts[TD_FIND_KIND_COUNT];      /* exact per-kind finding counts */
    int64_t n_errors, n_warnings;
    td_finding *findings;                    /* first TD_INSPECT_MAX_FINDINGS */
    size_t n_findings;
} td_inspect_report;

/* progress: draw a progress bar on stderr while checking modules (only when it is a terminal). */
td_status td_inspect(const char *dir, bool progress, td_inspect_report *rep, td_err *err);
void td_inspect_report_free(td_inspect_report *rep);
void td_inspect_print(const td_inspect_report *rep, FILE *out);
char *td_inspect_json(const td_inspect_report *rep);

const char *td_finding_kind_name(td_finding_kind k);

#endif /* TD_INSPECT_H */
