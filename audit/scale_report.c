/* scale_report.c — human summary and JSON output of `tandem audit e4m3` (see scale_report.h). */
#include "scale_report.h"
#include "version.h"

#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *td_scale_proj_name(td_moe_proj p)
{
    switch (p) {
    case TD_MOE_GATE: return "gate";
    case TD_MOE_UP: return "up";
    case TD_MOE_DOWN: return "down";
    default: return "";
    }
}

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

/* "12.3 MiB" style byte counts. */
static const char *fmt_bytes(int64_t b, char *buf, size_t cap)
{
    double v = (double)b;
    const char *u = "B";
    if (fabs(v) >= 1024.0 * 1024 * 1024) {
        v /= 1024.0 * 1024 * 1024;
        u = "GiB";
    } else if (fabs(v) >= 1024.0 * 1024) {
        v /= 1024.0 * 1024;
        u = "MiB";
    } else if (fabs(v) >= 1024.0) {
        v /= 1024.0;
        u = "KiB";
    }
    if (!strcmp(u, "B")) snprintf(buf, cap, "%lld B", (long long)b);
    else snprintf(buf, cap, "%.2f %s", v, u);
    return buf;
}

static const char *fmt_range(float lo, float hi, char *buf, size_t cap)
{
    if (isnan(lo) || isnan(hi)) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%.4g..%.4g", (double)lo, (double)hi);
    return buf;
}

/* ---- Part 1 table --------------------------------------------------------------------------- */

void td_codec_report_print(const td_codec_report *rep, FILE *out)
{
    fprintf(out, "Part 1: codec self-audit (%s codec, seed %llu): %zu checks, %lld failed, %.2f s\n",
            rep->codec, (unsigned long long)rep->seed, rep->n, (long long)rep->failed, rep->seconds);
    fprintf(out, "  %-28s %10s %10s  %s\n", "check", "elements", "mismatches", "verdict");
    for (size_t i = 0; i < rep->n; i++) {
        const td_codec_check *k = &rep->checks[i];
        fprintf(out, "  %-28s %10lld %10lld  %s\n", k->name, (long long)k->elements,
                (long long)k->mismatches, k->passed ? "pass" : "FAIL");
        if (!k->passed) {
            if (k->first[0]) fprintf(out, "      first mismatch (#%lld): %s\n", (long long)k->first_index, k->first);
            else fprintf(out, "      nothing was tested\n");
        }
    }
}

/* ---- human summary -------------------------------------------------------------------------- */

typedef struct text_layer_row {
    int32_t layer;
    td_scale_layer_sum sum;
} text_layer_row;

typedef struct text_list {
    char (*s)[900];
    size_t n, cap;
    int64_t more;                /* lines past the limit, counted only */
} text_list;

struct td_e4m3_text {
    int max_list;
    bool verbose;
    bool began;
    char model[512], family[32], prefix[64], algo[32];
    int tp, threads;
    bool elementwise;
    text_layer_row *rows;
    size_t n_rows, cap_rows;
    text_list rej;               /* rejected or unreadable tensors */
    text_list stages;            /* rejected stage slices (every slice with verbose) */
    text_list finds;             /* findings and notes */
    text_list all;               /* verbose: every tensor */
};

td_status td_e4m3_text_new(int max_list, bool verbose, td_e4m3_text **out, td_err *err)
{
    td_e4m3_text *t = calloc(1, sizeof *t);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
    t->max_list = max_list < 0 ? 0 : max_list;
    t->verbose = verbose;
    *out = t;
    return TD_OK;
}

void td_e4m3_text_free(td_e4m3_text *t)
{
    if (!t) return;
    free(t->rows);
    free(t->rej.s);
    free(t->stages.s);
    free(t->finds.s);
    free(t->all.s);
    free(t);
}

/* Append a line unless `limit` lines are kept already (then it is only counted). */
static td_status push_line(text_list *l, size_t limit, const char *line, td_err *err)
{
    if (l->n >= limit) {
        l->more++;
        return TD_OK;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 32;
        char (*p)[900] = realloc(l->s, cap * sizeof *p);
        if (!p) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
        l->s = p;
        l->cap = cap;
    }
    copy_str(l->s[l->n], sizeof l->s[0], line);
    l->n++;
    return TD_OK;
}

td_status td_e4m3_text_begin(td_e4m3_text *t, const td_scale_info *info, td_err *err)
{
    (void)err;
    t->began = true;
    copy_str(t->model, sizeof t->model, info->model);
    copy_str(t->family, sizeof t->family, info->family);
    copy_str(t->prefix, sizeof t->prefix, info->prefix);
    copy_str(t->algo, sizeof t->algo, info->quant_algo);
    t->tp = info->tp;
    t->threads = info->threads;
    t->elementwise = info->elementwise;
    return TD_OK;
}

static void describe_first(const td_scale_first *f, char *buf, size_t cap)
{
    const td_recon_eval *e = &f->ev;
    snprintf(buf, cap, "[%lld, %lld] code 0x%02X raw 0x%02X prepared 0x%04X strict 0x%04X effective "
             "0x%04X fast 0x%04X", (long long)f->row, (long long)f->col, e->code, e->raw, e->prepared,
             e->strict, e->effective, e->fast);
}

td_status td_e4m3_text_layer(td_e4m3_text *t, const td_scale_layer *l, td_err *err)
{
    if (t->n_rows == t->cap_rows) {
        size_t cap = t->cap_rows ? 2 * t->cap_rows : 64;
        text_layer_row *p = realloc(t->rows, cap * sizeof *p);
        if (!p) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
        t->rows = p;
        t->cap_rows = cap;
    }
    t->rows[t->n_rows].layer = l->layer;
    t->rows[t->n_rows].sum = l->sum;
    t->n_rows++;
    size_t limit = (size_t)t->max_list, unlimited = (size_t)-1;
    char line[900], first[200];
    td_status st = TD_OK;
    for (size_t i = 0; i < l->n_tensors && !st; i++) {
        const td_scale_tensor *x = &l->tensors[i];
        if (x->status) {
            snprintf(line, sizeof line, "%s  error: %s", x->scale_name, x->error);
            st = push_line(&t->rej, limit, line, err);
        } else if (!x->admit) {
            describe_first(&x->all.first, first, sizeof first);
            char ranks[128] = "";
            if (x->n_ranks > 1) {
                size_t o = (size_t)snprintf(ranks, sizeof ranks, "; rejected on rank(s)");
                for (int r = 0; r < x->n_ranks && o < sizeof ranks; r++)
                    if (x->ranks[r].rejected) o += (size_t)snprintf(ranks + o, sizeof ranks - o, " %d", r);
            }
            char why[256];
            size_t o = 0;
            why[0] = 0;
            for (int r = 1; r < TD_SCALE_REASON_COUNT && o < sizeof why; r++)
                if (x->all.by_reason[r])
                    o += (size_t)snprintf(why + o, sizeof why - o, "%s%s %lld", o ? ", " : "",
                                          td_scale_reason_name((td_scale_reason)r), (long long)x->all.by_reason[r]);
            snprintf(line, sizeof line, "%s  %s: %lld of %lld elements rejected (%s); first %s%s",
                     x->scale_name, td_scale_reason_name(x->all.reason), (long long)x->all.rejected,
                     (long long)x->all.elements, why, first, ranks);
            st = push_line(&t->rej, limit, line, err);
        }
        if (!st && t->verbose) {
            snprintf(line, sizeof line, "%-7s %s  codes %d..%d  global %.6g",
                     x->status ? "error" : x->admit ? "admit" : "reject", x->scale_name,
                     x->census.code_min, x->census.code_max, (double)x->global);
            st = push_line(&t->all, unlimited, line, err);
        }
    }
    for (size_t i = 0; i < l->n_stages && !st; i++) {
        const td_scale_stage *s = &l->stages[i];
        if (s->admit && !t->verbose) continue;
        char rank[32], lay[200] = "", tail[400] = "";
        if (s->rank >= 0) snprintf(rank, sizeof rank, "rank %d", (int)s->rank);
        else snprintf(rank, sizeof rank, "whole tensors");
        if (s->is_w13) {
            size_t o = 0;
            for (int k = 0; k < TD_W13_LAYOUT_COUNT && o < sizeof lay; k++) {
                const td_scale_layout_check *c = &s->layout[k];
                o += (size_t)snprintf(lay + o, sizeof lay - o, "%s %s%s", k ? "," : "; layout",
                                      td_w13_layout_name((td_w13_layout)k),
                                      !c->applicable ? " n/a" : c->rejected ? " MISMATCH" : " ok");
            }
        }
        if (s->admit) snprintf(tail, sizeof tail, ", saves %lld B", (long long)s->saved_bytes);
        else if (s->first_tensor[0])
            snprintf(tail, sizeof tail, "; first %s (%s)", s->first_tensor, td_scale_reason_name(s->first_reason));
        snprintf(line, sizeof line, "L%d %s %s: %s, %lld of %lld tensors rejected%s%s", (int)s->layer,
                 s->name, rank, s->admit ? "admit" : "reject", (long long)s->tensors_rejected,
                 (long long)s->tensors, lay, tail);
        st = push_line(&t->stages, t->verbose ? unlimited : limit, line, err);
    }
    for (size_t i = 0; i < l->n_findings && !st; i++) {
        const td_scale_finding *f = &l->findings[i];
        snprintf(line, sizeof line, "%s %s: %s", f->counts ? "FAIL" : "note",
                 td_scale_finding_kind_name(f->kind), f->msg);
        st = push_line(&t->finds, t->verbose ? unlimited : limit, line, err);
    }
    return st;
}

static void print_sum_row(FILE *out, const char *label, const td_scale_layer_sum *s)
{
    char codes[32], glob[48], prep[48], saved[32];
    if (s->code_min >= 0) snprintf(codes, sizeof codes, "%d..%d", s->code_min, s->code_max);
    else snprintf(codes, sizeof codes, "-");
    char gr[40];
    snprintf(glob, sizeof glob, "%lld %s", (long long)s->globals_distinct,
             fmt_range(s->global_min, s->global_max, gr, sizeof gr));
    fmt_range(s->prep_min, s->prep_max, prep, sizeof prep);
    fprintf(out, "  %-6s %8lld %8lld %8lld %9s %6lld %5lld %5lld %5lld  %-26s %-22s %12s\n", label,
            (long long)s->tensors, (long long)s->admitted, (long long)(s->rejected + s->input_errors),
            codes, (long long)s->zero, (long long)s->subnormal, (long long)s->negative,
            (long long)s->nan, glob, prep, fmt_bytes(s->saved_bytes, saved, sizeof saved));
}

static void print_list(FILE *out, const text_list *l, const char *title)
{
    if (!l->n && !l->more) return;
    fprintf(out, "\n%s (%lld):\n", title, (long long)(l->n + (size_t)l->more));
    for (size_t i = 0; i < l->n; i++) fprintf(out, "  %s\n", l->s[i]);
    if (l->more) fprintf(out, "  ... and %lld more (--json has every one)\n", (long long)l->more);
}

void td_e4m3_text_print(const td_e4m3_text *t, const td_codec_report *rep, const td_scale_summary *sum,
                        FILE *out)
{
    if (rep) td_codec_report_print(rep, out);
    if (!sum || !t->began) return;
    fprintf(out, "\nPart 2: scale storage of %s (%s, prefix %s, %s), tp %d, %d thread(s)%s\n", t->model,
            t->family, t->prefix, t->algo[0] ? t->algo : "no quantization metadata", t->tp, t->threads,
            t->elementwise ? ", element by element" : "");
    fprintf(out, "  %-6s %8s %8s %8s %9s %6s %5s %5s %5s  %-26s %-22s %12s\n", "layer", "tensors",
            "admitted", "rejected", "codes", "zero", "sub", "neg", "nan", "globals (distinct, range)",
            "prepared FP16 range", "saved");
    for (size_t i = 0; i < t->n_rows; i++) {
        char label[16];
        if (t->rows[i].layer >= 0) snprintf(label, sizeof label, "%d", (int)t->rows[i].layer);
        else snprintf(label, sizeof label, "other");
        print_sum_row(out, label, &t->rows[i].sum);
    }
    if (t->n_rows != 1) print_sum_row(out, "total", &sum->total);
    const td_scale_layer_sum *s = &sum->total;
    if (s->prep_subnormal || s->prep_zero || s->prep_inf || s->prep_nan)
        fprintf(out, "  prepared FP16 scales: %lld subnormal, %lld zero, %lld inf, %lld NaN\n",
                (long long)s->prep_subnormal, (long long)s->prep_zero, (long long)s->prep_inf,
                (long long)s->prep_nan);
    print_list(out, &t->all, "tensors");
    print_list(out, &t->rej, "rejected tensors");
    print_list(out, &t->stages, t->verbose ? "stage slices" : "rejected stage slices");
    print_list(out, &t->finds, "findings");
    char saved[32];
    if (!s->tensors) {
        fprintf(out, "\nno NVFP4 tensor in the selection: nothing to audit (%.2f s)\n", sum->seconds);
        return;
    }
    fprintf(out, "\n%lld of %lld tensors admitted, %lld rejected", (long long)s->admitted,
            (long long)s->tensors, (long long)s->rejected);
    if (s->input_errors) fprintf(out, ", %lld not readable", (long long)s->input_errors);
    fprintf(out, "; %lld of %lld stage slices admitted", (long long)s->stages_admitted, (long long)s->stages);
    if (s->failed_findings) fprintf(out, "; %lld failed finding(s)", (long long)s->failed_findings);
    fprintf(out, "\nraw storage saves %s (all ranks; admitted stage slices only); %.2f s\n",
            fmt_bytes(s->saved_bytes, saved, sizeof saved), sum->seconds);
    bool any = false;
    for (int r = 1; r < TD_SCALE_REASON_COUNT; r++)
        if (s->by_reason[r]) {
            fprintf(out, "%s%s %lld", any ? ", " : "rejections by reason: ", td_scale_reason_name((td_scale_reason)r),
                    (long long)s->by_reason[r]);
            any = true;
        }
    if (any) fprintf(out, "\n");
}

/* ---- JSON ----------------------------------------------------------------------------------- */

struct td_e4m3_json {
    FILE *f;
    bool is_stdout;
    char path[1024];
    char tmp[1040];
    bool began_layers;
    bool first_layer;
    bool failed;
};

static void js_num(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, "%.9g", v);
    else fputs("null", f);
}

static void js_hex(FILE *f, unsigned v, int digits)
{
    fprintf(f, "\"0x%0*X\"", digits, v);
}

td_status td_e4m3_json_open(const char *path, td_e4m3_json **out, td_err *err)
{
    td_e4m3_json *j = calloc(1, sizeof *j);
    if (!j) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
    if (!strcmp(path, "-")) {
        j->f = stdout;
        j->is_stdout = true;
    } else {
        if (strlen(path) >= sizeof j->path) {
            free(j);
            return td_err_set(err, TD_ERR_ARG, "--json: path too long");
        }
        copy_str(j->path, sizeof j->path, path);
        snprintf(j->tmp, sizeof j->tmp, "%s.tmp", path);
        j->f = fopen(j->tmp, "w");
        if (!j->f) {
            free(j);
            return td_err_set(err, TD_ERR_IO, "--json %s: cannot create %s.tmp", path, path);
        }
    }
    fprintf(j->f, "{\"command\":\"audit e4m3\",\"tandem_version\":");
    td_json_fput_str(j->f, td_version());
    fprintf(j->f, ",\"tandem_commit\":");
    td_json_fput_str(j->f, td_commit());
    *out = j;
    return TD_OK;
}

td_status td_e4m3_json_codec(td_e4m3_json *j, const td_codec_report *rep, td_err *err)
{
    (void)err;
    FILE *f = j->f;
    fprintf(f, ",\n\"codec\":{\"codec\":");
    td_json_fput_str(f, rep->codec);
    fprintf(f, ",\"seed\":%llu,\"seconds\":", (unsigned long long)rep->seed);
    js_num(f, rep->seconds);
    fprintf(f, ",\"passed\":%s,\"checks\":[", rep->failed ? "false" : "true");
    for (size_t i = 0; i < rep->n; i++) {
        const td_codec_check *k = &rep->checks[i];
        fprintf(f, "%s\n {\"name\":", i ? "," : "");
        td_json_fput_str(f, k->name);
        fprintf(f, ",\"elements\":%lld,\"mismatches\":%lld,\"nan_mismatches\":%lld,\"first_index\":%lld,"
                   "\"first\":", (long long)k->elements, (long long)k->mismatches,
                (long long)k->nan_mismatches, (long long)k->first_index);
        if (k->first[0]) td_json_fput_str(f, k->first);
        else fputs("null", f);
        fprintf(f, ",\"verdict\":\"%s\"}", k->passed ? "pass" : "fail");
    }
    fprintf(f, "]}");
    return TD_OK;
}

td_status td_e4m3_json_begin(td_e4m3_json *j, const td_scale_info *info, td_err *err)
{
    (void)err;
    FILE *f = j->f;
    fprintf(f, ",\n\"checkpoint\":{\"model\":");
    td_json_fput_str(f, info->model);
    fprintf(f, ",\"family\":");
    td_json_fput_str(f, info->family);
    fprintf(f, ",\"model_type\":");
    td_json_fput_str(f, info->model_type);
    fprintf(f, ",\"prefix\":");
    td_json_fput_str(f, info->prefix);
    fprintf(f, ",\"quant_algo\":");
    td_json_fput_str(f, info->quant_algo);
    fprintf(f, ",\"producer\":");
    td_json_fput_str(f, info->producer);
    fprintf(f, ",\"tp\":%d,\"threads\":%d,\"elementwise\":%s,\"tensors\":%lld}", info->tp, info->threads,
            info->elementwise ? "true" : "false", (long long)info->tensors);
    fprintf(f, ",\n\"layers\":[");
    j->began_layers = true;
    j->first_layer = true;
    return TD_OK;
}

static void js_eval_fields(FILE *f, const td_recon_eval *e)
{
    fprintf(f, "\"code\":");
    js_hex(f, e->code, 2);
    fprintf(f, ",\"raw\":");
    js_hex(f, e->raw, 2);
    fprintf(f, ",\"prepared\":");
    js_hex(f, e->prepared, 4);
    fprintf(f, ",\"strict\":");
    js_hex(f, e->strict, 4);
    fprintf(f, ",\"effective\":");
    js_hex(f, e->effective, 4);
    fprintf(f, ",\"fast\":");
    js_hex(f, e->fast, 4);
    fprintf(f, ",\"reason\":\"%s\"", td_scale_reason_name(e->reason));
}

static void js_first(FILE *f, const td_scale_first *fi)
{
    if (fi->row < 0) {
        fputs("null", f);
        return;
    }
    fprintf(f, "{\"row\":%lld,\"col\":%lld,", (long long)fi->row, (long long)fi->col);
    js_eval_fields(f, &fi->ev);
    fputc('}', f);
}

static void js_counts(FILE *f, const td_scale_counts *c)
{
    fprintf(f, "\"elements\":%lld,\"rejected\":%lld,\"checks\":{"
               "\"strict\":{\"mismatches\":%lld},\"fast\":{\"mismatches\":%lld},"
               "\"finite\":{\"mismatches\":%lld},\"range\":{\"mismatches\":%lld}},\"reasons\":{",
            (long long)c->elements, (long long)c->rejected, (long long)c->strict_mismatch,
            (long long)c->fast_mismatch, (long long)c->nonfinite, (long long)c->out_of_range);
    bool any = false;
    for (int r = 1; r < TD_SCALE_REASON_COUNT; r++)
        if (c->by_reason[r]) {
            fprintf(f, "%s\"%s\":%lld", any ? "," : "", td_scale_reason_name((td_scale_reason)r),
                    (long long)c->by_reason[r]);
            any = true;
        }
    fprintf(f, "},\"reason\":");
    if (c->rejected) fprintf(f, "\"%s\"", td_scale_reason_name(c->reason));
    else fputs("null", f);
    fprintf(f, ",\"first\":");
    js_first(f, &c->first);
    fprintf(f, ",\"first_any\":");
    js_first(f, &c->first_any);
}

static void js_sum(FILE *f, const td_scale_layer_sum *s)
{
    fprintf(f, "{\"tensors\":%lld,\"admitted\":%lld,\"rejected\":%lld,\"input_errors\":%lld,"
               "\"elements\":%lld,\"rejected_elements\":%lld,\"rejected_by_reason\":{",
            (long long)s->tensors, (long long)s->admitted, (long long)s->rejected,
            (long long)s->input_errors, (long long)s->elements, (long long)s->rejected_elements);
    bool any = false;
    for (int r = 1; r < TD_SCALE_REASON_COUNT; r++)
        if (s->by_reason[r]) {
            fprintf(f, "%s\"%s\":%lld", any ? "," : "", td_scale_reason_name((td_scale_reason)r),
                    (long long)s->by_reason[r]);
            any = true;
        }
    fprintf(f, "},\"codes\":{\"zero\":%lld,\"subnormal\":%lld,\"negative\":%lld,\"nan\":%lld,"
               "\"min\":%d,\"max\":%d},\"prepared\":{\"min\":",
            (long long)s->zero, (long long)s->subnormal, (long long)s->negative, (long long)s->nan,
            s->code_min, s->code_max);
    js_num(f, (double)s->prep_min);
    fprintf(f, ",\"max\":");
    js_num(f, (double)s->prep_max);
    fprintf(f, ",\"zero\":%lld,\"subnormal\":%lld,\"inf\":%lld,\"nan\":%lld},\"globals\":{\"distinct\":%lld,"
               "\"min\":", (long long)s->prep_zero, (long long)s->prep_subnormal, (long long)s->prep_inf,
            (long long)s->prep_nan, (long long)s->globals_distinct);
    js_num(f, (double)s->global_min);
    fprintf(f, ",\"max\":");
    js_num(f, (double)s->global_max);
    fprintf(f, "},\"stages\":%lld,\"stages_admitted\":%lld,\"saved_bytes\":%lld,\"failed_findings\":%lld,"
               "\"notes\":%lld}", (long long)s->stages, (long long)s->stages_admitted,
            (long long)s->saved_bytes, (long long)s->failed_findings, (long long)s->notes);
}

static void js_tensor(FILE *f, const td_scale_tensor *t, int tp)
{
    fprintf(f, "{\"tensor\":");
    td_json_fput_str(f, t->scale_name);
    fprintf(f, ",\"global_tensor\":");
    td_json_fput_str(f, t->global_name);
    fprintf(f, ",\"module\":");
    td_json_fput_str(f, t->module);
    fprintf(f, ",\"layer\":%d,\"expert\":%d,\"proj\":", (int)t->layer, (int)t->expert);
    if (t->proj == TD_MOE_NONE) fputs("null", f);
    else td_json_fput_str(f, td_scale_proj_name(t->proj));
    fprintf(f, ",\"stage\":");
    td_json_fput_str(f, t->stage);
    fprintf(f, ",\"convention\":");
    td_json_fput_str(f, td_nvfp4_conv_name(t->conv));
    fprintf(f, ",\"shape\":[%lld,%lld],\"verdict\":\"%s\"", (long long)t->rows, (long long)t->cols,
            t->status ? "error" : t->admit ? "admit" : "reject");
    if (t->status) {
        fprintf(f, ",\"error\":");
        td_json_fput_str(f, t->error);
        fputc('}', f);
        return;
    }
    fprintf(f, ",\"global\":");
    js_num(f, (double)t->global);
    fprintf(f, ",\"global_bits\":");
    js_hex(f, fbits(t->global), 8);
    fprintf(f, ",\"g\":");
    js_num(f, (double)t->gl.g);
    fprintf(f, ",\"g_bits\":");
    js_hex(f, fbits(t->gl.g), 8);
    fprintf(f, ",\"hi\":");
    js_hex(f, t->gl.hi, 4);
    fprintf(f, ",\"lo\":");
    js_hex(f, t->gl.lo, 4);
    fputc(',', f);
    js_counts(f, &t->all);
    const td_scale_census *c = &t->census;
    fprintf(f, ",\"census\":{\"histogram\":[");
    bool any = false;
    for (int code = 0; code < 256; code++)
        if (c->hist[code]) {
            fprintf(f, "%s[%d,%lld]", any ? "," : "", code, (long long)c->hist[code]);
            any = true;
        }
    fprintf(f, "],\"zero\":%lld,\"subnormal\":%lld,\"negative\":%lld,\"nan\":%lld,\"code_min\":%d,"
               "\"code_max\":%d,\"distinct\":%d,\"prepared\":{\"min\":",
            (long long)c->zero, (long long)c->subnormal, (long long)c->negative, (long long)c->nan,
            c->code_min, c->code_max, c->distinct);
    js_num(f, (double)c->prep_min);
    fprintf(f, ",\"max\":");
    js_num(f, (double)c->prep_max);
    fprintf(f, ",\"zero\":%lld,\"subnormal\":%lld,\"inf\":%lld,\"nan\":%lld}}", (long long)c->prep_zero,
            (long long)c->prep_subnormal, (long long)c->prep_inf, (long long)c->prep_nan);
    fprintf(f, ",\"ranks\":");
    if (tp > 1 && t->n_ranks > 1) {
        fputc('[', f);
        for (int r = 0; r < t->n_ranks; r++) {
            fprintf(f, "%s{\"rank\":%d,\"verdict\":\"%s\",", r ? "," : "", r,
                    t->ranks[r].rejected ? "reject" : "admit");
            js_counts(f, &t->ranks[r]);
            fputc('}', f);
        }
        fputc(']', f);
    } else {
        fputs("null", f);
    }
    fputc('}', f);
}

static void js_stage(FILE *f, const td_scale_stage *s)
{
    fprintf(f, "{\"stage\":");
    td_json_fput_str(f, s->name);
    fprintf(f, ",\"layer\":%d,\"rank\":", (int)s->layer);
    if (s->rank >= 0) fprintf(f, "%d", (int)s->rank);
    else fputs("null", f);
    fprintf(f, ",\"verdict\":\"%s\",\"tensors\":%lld,\"tensors_rejected\":%lld,\"elements\":%lld,"
               "\"rejected\":%lld,\"globals\":%lld,\"saved_bytes\":%lld,\"first_tensor\":",
            s->admit ? "admit" : "reject", (long long)s->tensors, (long long)s->tensors_rejected,
            (long long)s->elements, (long long)s->rejected, (long long)s->globals,
            (long long)s->saved_bytes);
    if (s->first_tensor[0]) td_json_fput_str(f, s->first_tensor);
    else fputs("null", f);
    fprintf(f, ",\"first_reason\":");
    if (s->first_tensor[0]) fprintf(f, "\"%s\"", td_scale_reason_name(s->first_reason));
    else fputs("null", f);
    fprintf(f, ",\"layout\":");
    if (!s->is_w13) {
        fputs("null}", f);
        return;
    }
    fputc('{', f);
    for (int l = 0; l < TD_W13_LAYOUT_COUNT; l++) {
        const td_scale_layout_check *c = &s->layout[l];
        fprintf(f, "%s\"%s\":{\"applicable\":%s,\"columns\":%lld,\"slot_mismatch\":%lld,\"rejected\":%lld,"
                   "\"verdict\":\"%s\",\"first\":", l ? "," : "", td_w13_layout_name((td_w13_layout)l),
                c->applicable ? "true" : "false", (long long)c->columns, (long long)c->slot_mismatch,
                (long long)c->rejected, !c->applicable ? "skip" : c->rejected ? "fail" : "pass");
        if (c->first_expert >= 0)
            fprintf(f, "{\"expert\":%d,\"col\":%lld,\"group\":%lld}", (int)c->first_expert,
                    (long long)c->first_col, (long long)c->first_group);
        else fputs("null", f);
        fputc('}', f);
    }
    fputs("}}", f);
}

td_status td_e4m3_json_layer(td_e4m3_json *j, const td_scale_layer *l, td_err *err)
{
    FILE *f = j->f;
    fprintf(f, "%s\n{\"layer\":", j->first_layer ? "" : ",");
    j->first_layer = false;
    if (l->layer >= 0) fprintf(f, "%d", (int)l->layer);
    else fputs("null", f);
    fprintf(f, ",\"summary\":");
    js_sum(f, &l->sum);
    fprintf(f, ",\"tensors\":[");
    for (size_t i = 0; i < l->n_tensors; i++) {
        fputs(i ? ",\n " : "\n ", f);
        js_tensor(f, &l->tensors[i], l->tp);
    }
    fprintf(f, "],\"stages\":[");
    for (size_t i = 0; i < l->n_stages; i++) {
        fputs(i ? ",\n " : "\n ", f);
        js_stage(f, &l->stages[i]);
    }
    fprintf(f, "],\"findings\":[");
    for (size_t i = 0; i < l->n_findings; i++) {
        const td_scale_finding *x = &l->findings[i];
        fprintf(f, "%s\n {\"kind\":\"%s\",\"counts\":%s,\"module\":", i ? "," : "",
                td_scale_finding_kind_name(x->kind), x->counts ? "true" : "false");
        td_json_fput_str(f, x->module);
        fprintf(f, ",\"expert\":%d,\"a\":", (int)x->expert);
        js_num(f, (double)x->a);
        fprintf(f, ",\"b\":");
        js_num(f, (double)x->b);
        fprintf(f, ",\"message\":");
        td_json_fput_str(f, x->msg);
        fputc('}', f);
    }
    fprintf(f, "]}");
    if (ferror(f)) {
        j->failed = true;
        return td_err_set(err, TD_ERR_IO, "--json %s: write failed", j->is_stdout ? "-" : j->path);
    }
    return TD_OK;
}

td_status td_e4m3_json_close(td_e4m3_json *j, const td_scale_summary *sum, int exit_status, td_err *err)
{
    FILE *f = j->f;
    if (j->began_layers) fprintf(f, "]");
    fprintf(f, ",\n\"summary\":");
    if (sum) {
        fprintf(f, "{\"layers\":%lld,\"tp\":%d,\"threads\":%d,\"seconds\":", (long long)sum->layers, sum->tp,
                sum->threads);
        js_num(f, sum->seconds);
        fprintf(f, ",\"total\":");
        js_sum(f, &sum->total);
        fputc('}', f);
    } else {
        fputs("null", f);
    }
    fprintf(f, ",\"exit_status\":%d}\n", exit_status);
    td_status st = TD_OK;
    if (j->is_stdout) {
        if (fflush(f) != 0) st = td_err_set(err, TD_ERR_IO, "--json -: write to stdout failed");
        j->f = NULL;
        free(j);
        return st;
    }
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    j->f = NULL;
    if (bad) {
        remove(j->tmp);
        st = td_err_set(err, TD_ERR_IO, "--json %s: write failed", j->path);
    } else if (rename(j->tmp, j->path) != 0) {
        remove(j->tmp);
        st = td_err_set(err, TD_ERR_IO, "--json %s: cannot rename %s into place", j->path, j->tmp);
    }
    free(j);
    return st;
}

void td_e4m3_json_free(td_e4m3_json *j)
{
    if (!j) return;
    if (j->f && !j->is_stdout) {
        fclose(j->f);
        remove(j->tmp);
    }
    free(j);
}
