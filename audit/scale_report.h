/* scale_report.h — output of `tandem audit e4m3`: the human summary and the JSON file.
 *
 * Human (td_e4m3_text): the Part 1 table (one line per check, the first mismatch under a
 * failing one), then for Part 2 one line per layer (tensors, admitted, rejected, code range,
 * zero/subnormal/negative/NaN codes, distinct globals and their range, prepared FP16 range,
 * bytes saved by raw storage), a total line, the first rejected tensors with their first
 * offending element and reason, rejected stage slices, findings and notes, and a verdict line.
 * Layers are folded into the text as they arrive; only the per-layer lines and the first
 * `max_list` rejections/findings are kept.
 *
 * JSON (td_e4m3_json): one object, written as the audit runs:
 *   {"command": "audit e4m3", "tandem_version", "tandem_commit",
 *    "codec": {"codec", "seed", "seconds", "passed", "checks": [{name, elements, mismatches,
 *              nan_mismatches, first_index, first, verdict}]},
 *    "checkpoint": {model, family, model_type, prefix, quant_algo, producer, tp, threads,
 *                   elementwise, tensors},                            (Part 2 only)
 *    "layers": [{"layer", "summary": {...}, "tensors": [...], "stages": [...],
 *                "findings": [...]}],                                 (Part 2 only)
 *    "summary": {...}, "exit_status": N}
 * docs/audit-e4m3.md documents every field. Non-finite numbers are written as null, with the
 * exact float32 or FP16 bits alongside as "0x..." strings. The file is written to PATH.tmp and
 * renamed to PATH by td_e4m3_json_close(); "-" writes to stdout.
 *
 * Contract: objects are owned by the caller (free functions are NULL-safe); not thread-safe;
 * errors name the output path.
 */
#ifndef TD_SCALE_REPORT_H
#define TD_SCALE_REPORT_H

#include "e4m3.h"
#include "scale_audit.h"

#include <stdio.h>

/* ---- human summary ------------------------------------------------------------------------- */

typedef struct td_e4m3_text td_e4m3_text;

/* max_list: rejections and findings listed in detail (the rest are counted); verbose: list
 * every tensor and every stage slice. */
td_status td_e4m3_text_new(int max_list, bool verbose, td_e4m3_text **out, td_err *err);
void td_e4m3_text_free(td_e4m3_text *t);
td_status td_e4m3_text_begin(td_e4m3_text *t, const td_scale_info *info, td_err *err);
td_status td_e4m3_text_layer(td_e4m3_text *t, const td_scale_layer *layer, td_err *err);
/* Print everything: the codec table (rep may be NULL), then Part 2 (sum NULL: none ran). */
void td_e4m3_text_print(const td_e4m3_text *t, const td_codec_report *rep, const td_scale_summary *sum,
                        FILE *out);

/* The Part 1 table alone. */
void td_codec_report_print(const td_codec_report *rep, FILE *out);

/* ---- JSON ---------------------------------------------------------------------------------- */

typedef struct td_e4m3_json td_e4m3_json;

td_status td_e4m3_json_open(const char *path, td_e4m3_json **out, td_err *err);
td_status td_e4m3_json_codec(td_e4m3_json *j, const td_codec_report *rep, td_err *err);
td_status td_e4m3_json_begin(td_e4m3_json *j, const td_scale_info *info, td_err *err);
td_status td_e4m3_json_layer(td_e4m3_json *j, const td_scale_layer *layer, td_err *err);
/* Write the summary (sum NULL: Part 2 did not run) and the exit status, close, rename. */
td_status td_e4m3_json_close(td_e4m3_json *j, const td_scale_summary *sum, int exit_status, td_err *err);
/* Abandon: close and remove PATH.tmp (PATH untouched). NULL-safe; no-op after close. */
void td_e4m3_json_free(td_e4m3_json *j);

/* "gate", "up", "down" or "" for a routed-expert projection. */
const char *td_scale_proj_name(td_moe_proj p);

#endif /* TD_SCALE_REPORT_H */
