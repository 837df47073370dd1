/* e4m3_db.h — `tandem audit e4m3` results into the results store (db/db.h). Every call the
 * audit makes into db/ is in e4m3_db.c.
 *
 * A run of kind "audit.e4m3" (provenance captured by td_db_run_begin: command line,
 * checkpoint fingerprint, seed) holds:
 * - encoding_checks rows (key: check_name, stage, variant):
 *     codec.<check>                  one per Part 1 check (mismatches exclude NaN positions,
 *                                    which are in nan_mismatches)
 *     scale.strict|fast|finite|range per tensor (stage = block-scale tensor name): elements and
 *                                    mismatching elements of that check
 *     scale.verdict                  per tensor: admitted (exact) or not; first_diff is the flat
 *                                    index of the first rejected element, detail its reason,
 *                                    position and FP16 values; with --tp N also one row per
 *                                    rank slice (variant "tpN.rankR"); an unreadable tensor is a
 *                                    failed row whose detail is the error
 *     scale.stage                    per stage slice (stage "L<layer>.w13", "L<layer>.w2" or the
 *                                    module name; variant "tpN.rankR" or ""), detail the bytes
 *                                    saved or the first rejected tensor
 *     scale.layout.<layout>          per w13 stage slice: columns checked, elements failing
 *                                    through a wrong global slot (skip when not applicable)
 *     scale.finding.<kind>           sibling-global mismatches (fail) and notes (skip)
 *     scale.total                    per-check totals of the run (stage strict, fast, finite,
 *                                    range, tensors, stages)
 * - scale_census rows: (block-scale tensor, code, count) for every code present.
 * Each layer is written as one batch (one transaction).
 *
 * Contract: td_e4m3_db owns its db handle; td_e4m3_db_free() (NULL-safe) closes it and, if the
 * run is still open, ends it as failed. Errors name the store path.
 */
#ifndef TD_E4M3_DB_H
#define TD_E4M3_DB_H

#include "e4m3.h"
#include "scale_audit.h"

typedef struct td_e4m3_db td_e4m3_db;

/* Open (creating when absent) the store at `path` (td_db_path_resolve rules apply to NULL)
 * and begin the run. checkpoint may be NULL (Part 1 only). */
td_status td_e4m3_db_open(const char *path, int argc, char *const *argv, const char *checkpoint,
                          uint64_t seed, td_e4m3_db **out, td_err *err);
td_status td_e4m3_db_codec(td_e4m3_db *d, const td_codec_report *rep, td_err *err);
td_status td_e4m3_db_layer(td_e4m3_db *d, const td_scale_layer *layer, td_err *err);
/* Per-check totals of everything written by td_e4m3_db_layer(). */
td_status td_e4m3_db_summary(td_e4m3_db *d, const td_scale_summary *sum, td_err *err);
/* End the run: completed (ok; the audit ran to the end, whatever it found) or failed. */
td_status td_e4m3_db_end(td_e4m3_db *d, bool completed, int exit_status, const char *message, td_err *err);
int64_t td_e4m3_db_run_id(const td_e4m3_db *d);
const char *td_e4m3_db_path(const td_e4m3_db *d);
void td_e4m3_db_free(td_e4m3_db *d);

#endif /* TD_E4M3_DB_H */
