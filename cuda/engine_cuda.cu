/* engine_cuda.cu — the CUDA engine `cuda` (engine.h contract): loads a checkpoint's MoE layers
 * onto the GPU and runs the MoE block and the router with the kernels of cuda/moe.cu.
 *
 * Loading: config.json, the quantization metadata and the tensors are read at load, checked
 * like the reference engine checks them (dtype, shape, scalar globals, NVFP4 alignment of the
 * TP slices) and copied to device memory, every MoE layer at once: NVFP4 weights as packed
 * E2M1 bytes plus prepared FP16 effective scales (eff = fp16_rn(fl32(E4M3 S x g_dec)) for
 * ModelOpt, fp16_rn(fl32(E4M3 S / g_enc)) for compressed-tensors; the same values as the
 * reference's scale=fp16), dense BF16/F16/F32 weights as stored. The workspace for
 * CU_TOKEN_CAP tokens, the stream and the host staging buffers are allocated at load too:
 * run_block never allocates; larger calls run in chunks of CU_TOKEN_CAP tokens (tokens are
 * independent in the MoE block, so chunking does not change any bit).
 *
 * Variant options: act_dtype=fp32|fp16|bf16 and tp_size/tp_rank (one rank's shard, or every
 * rank summed in rank order for tp_rank=all, the reference's slicing) are implemented.
 * storage=raw, moe_dispatch=grouped and graphs=on are refused at load with TD_ERR_UNSUPPORTED
 * naming the option (never silently replaced by another computation). Numerics: cuda/moe.cuh.
 *
 * Errors name the engine, layer and tensor or CUDA call at fault. One engine owns one CUDA
 * stream and its device memory; nothing global.
 */
extern "C" {
#include "engine.h"
#include "config.h"
#include "formats.h"
#include "layout.h"
#include "quant.h"
#include "safetensors.h"
#include "nvfp4.h"
}
#include "moe.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per chunk of one run_block: the workspace is sized for this many at load. */
#define CU_TOKEN_CAP 256

typedef struct cu_layer {
    bool moe;
    cu_lin router;              /* [E, H] */
    cu_lin gate, up, down;      /* every routed expert back to back */
    bool has_shared;
    cu_lin sh_gate, sh_up, sh_down, sh_gw;
} cu_layer;

typedef struct cu_engine {
    td_engine base;             /* first member: the interface's view */
    char dir[1024];
    td_config cfg;
    td_quant quant;
    td_st_set *set;
    char prefix[64];
    cu_layer *layers;           /* [num_hidden_layers] */
    cudaStream_t stream;
    bool have_stream;
    void **dmem;                /* every device allocation, freed at the end */
    size_t n_dmem, cap_dmem;
    /* workspace (device) for CU_TOKEN_CAP tokens */
    float *x, *xa, *logits, *wts, *act, *eout, *sh_act, *sh_out, *sg, *out;
    int32_t *ids;
    /* host staging for taps */
    int32_t *h_ids;
    float *h_wts;
} cu_engine;

/* ==== device memory ========================================================================== */

static td_status dalloc(cu_engine *c, size_t bytes, void **out, td_err *err)
{
    *out = NULL;
    if (c->n_dmem == c->cap_dmem) {
        size_t n = c->cap_dmem ? 2 * c->cap_dmem : 64;
        void **p = (void **)realloc(c->dmem, n * sizeof *p);
        if (!p) return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
        c->dmem = p;
        c->cap_dmem = n;
    }
    void *d = NULL;
    TD_CU_TRY(err, cudaMalloc(&d, bytes ? bytes : 16));
    c->dmem[c->n_dmem++] = d;
    *out = d;
    return TD_OK;
}

/* ==== linear layers ========================================================================== */

/* One module as found in the checkpoint (host views into the mapped shards). */
typedef struct host_lin {
    int kind;                   /* cu_wkind */
    int64_t rows, cols;
    const uint8_t *w;
    const uint8_t *s;           /* NVFP4 E4M3 scales */
    float global;
    td_nvfp4_conv conv;
} host_lin;

static bool shape_is(const td_tensor *t, int64_t a, int64_t b)
{
    return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b;
}

static td_status find_linear(cu_engine *c, const char *module, int64_t rows, int64_t cols, host_lin *out,
                             td_err *err)
{
    td_quant_tensors q;
    td_status st = td_quant_resolve(&c->quant, module, true, &q, err);
    if (st) return st;
    td_tensor w, s, g;
    char have[96];
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    switch (q.scheme) {
    case TD_SCHEME_NONE:
        st = td_st_set_tensor(c->set, q.weight, &w, err);
        if (st) return st;
        if (w.dtype != TD_BF16 && w.dtype != TD_F16 && w.dtype != TD_F32)
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: dtype %s, expected BF16, F16 or F32 (unquantized module)",
                              q.weight, td_dtype_name(w.dtype));
        if (!shape_is(&w, rows, cols)) {
            td_shape_str(w.ndim, w.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: shape %s, expected [%lld, %lld]", q.weight, have,
                              (long long)rows, (long long)cols);
        }
        out->kind = w.dtype == TD_BF16 ? CU_W_BF16 : w.dtype == TD_F16 ? CU_W_F16 : CU_W_F32;
        out->w = (const uint8_t *)w.data;
        return TD_OK;
    case TD_SCHEME_NVFP4:
    case TD_SCHEME_NVFP4_CT:
        if (cols % TD_NVFP4_BLOCK)
            return td_err_set(err, TD_ERR_FORMAT, "module %s: %lld input features is not a multiple of 16 (NVFP4)",
                              module, (long long)cols);
        st = td_st_set_tensor(c->set, q.weight, &w, err);
        if (!st) st = td_st_set_tensor(c->set, q.scale, &s, err);
        if (!st) st = td_st_set_tensor(c->set, q.global, &g, err);
        if (st) return st;
        if (w.dtype != TD_U8 || !shape_is(&w, rows, cols / 2)) {
            td_shape_str(w.ndim, w.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected U8 [%lld, %lld] (packed E2M1)", q.weight,
                              td_dtype_name(w.dtype), have, (long long)rows, (long long)(cols / 2));
        }
        if (s.dtype != TD_F8_E4M3 || !shape_is(&s, rows, cols / TD_NVFP4_BLOCK)) {
            td_shape_str(s.ndim, s.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected F8_E4M3 [%lld, %lld] (block scales)",
                              q.scale, td_dtype_name(s.dtype), have, (long long)rows,
                              (long long)(cols / TD_NVFP4_BLOCK));
        }
        if (g.dtype != TD_F32 || td_tensor_numel(&g) != 1 || g.ndim > 1) {
            td_shape_str(g.ndim, g.shape, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected an F32 scalar (global scale)", q.global,
                              td_dtype_name(g.dtype), have);
        }
        out->kind = CU_W_NVFP4;
        out->w = (const uint8_t *)w.data;
        out->s = (const uint8_t *)s.data;
        memcpy(&out->global, g.data, sizeof out->global);
        out->conv = q.scheme == TD_SCHEME_NVFP4 ? TD_NVFP4_MODELOPT : TD_NVFP4_CT;
        return TD_OK;
    default:
        return td_err_set(err, TD_ERR_UNSUPPORTED, "module %s: scheme %s is not supported by the cuda engine yet",
                          module, td_scheme_name(q.scheme));
    }
}

static int64_t elem_bytes(int kind) { return kind == CU_W_F32 ? 4 : 2; }

/* Copy n modules of one shape and kind to the device back to back (prepared FP16 scales for
 * NVFP4). `names` [n] name the modules for errors. */
static td_status upload(cu_engine *c, const host_lin *h, int64_t n, char (*names)[256], cu_lin *out, td_err *err)
{
    const int64_t rows = h[0].rows, cols = h[0].cols;
    for (int64_t i = 1; i < n; i++)
        if (h[i].kind != h[0].kind)
            return td_err_set(err, TD_ERR_UNSUPPORTED,
                              "module %s is stored as %s but %s as %s: the cuda engine needs one storage per projection",
                              names[i], h[i].kind == CU_W_NVFP4 ? "NVFP4" : "dense", names[0],
                              h[0].kind == CU_W_NVFP4 ? "NVFP4" : "dense");
    memset(out, 0, sizeof *out);
    out->kind = h[0].kind;
    out->rows = rows;
    out->cols = cols;
    void *dw = NULL, *ds = NULL;
    if (h[0].kind == CU_W_NVFP4) {
        out->w_ld = cols / 2;
        out->s_ld = cols / TD_NVFP4_BLOCK;
        out->e_w = rows * out->w_ld;
        out->e_s = rows * out->s_ld;
        td_status st = dalloc(c, (size_t)(n * out->e_w), &dw, err);
        if (!st) st = dalloc(c, (size_t)(n * out->e_s) * sizeof(uint16_t), &ds, err);
        if (st) return st;
        uint16_t *tmp = (uint16_t *)malloc((size_t)out->e_s * sizeof *tmp);
        if (!tmp) return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
        for (int64_t i = 0; i < n; i++) {
            for (int64_t j = 0; j < out->e_s; j++)
                tmp[j] = td_f32_to_f16(td_nvfp4_block_factor(h[i].s[j], h[i].global, h[i].conv));
            cudaError_t e1 = cudaMemcpy((uint8_t *)dw + i * out->e_w, h[i].w, (size_t)out->e_w, cudaMemcpyHostToDevice);
            cudaError_t e2 = e1 == cudaSuccess ? cudaMemcpy((uint16_t *)ds + i * out->e_s, tmp,
                                                            (size_t)out->e_s * sizeof *tmp, cudaMemcpyHostToDevice)
                                               : e1;
            if (e2 != cudaSuccess) {
                free(tmp);
                return td_err_set(err, TD_ERR_INTERNAL, "engine cuda: copying %s to the device: %s", names[i],
                                  cudaGetErrorString(e2));
            }
        }
        free(tmp);
        out->w = (const uint8_t *)dw;
        out->s = (const __half *)ds;
        return TD_OK;
    }
    const int64_t es = elem_bytes(h[0].kind);
    out->w_ld = cols * es;
    out->e_w = rows * out->w_ld;
    td_status st = dalloc(c, (size_t)(n * out->e_w), &dw, err);
    if (st) return st;
    for (int64_t i = 0; i < n; i++)
        TD_CU_TRY(err, cudaMemcpy((uint8_t *)dw + i * out->e_w, h[i].w, (size_t)out->e_w, cudaMemcpyHostToDevice));
    out->w = (const uint8_t *)dw;
    return TD_OK;
}

static td_status load_one(cu_engine *c, const char *module, int64_t rows, int64_t cols, cu_lin *out, td_err *err)
{
    host_lin h;
    char names[1][256];
    snprintf(names[0], sizeof names[0], "%s", module);
    td_status st = find_linear(c, module, rows, cols, &h, err);
    if (!st) st = upload(c, &h, 1, names, out, err);
    return st;
}

static td_status load_layer(cu_engine *c, int64_t L, td_err *err)
{
    cu_layer *ly = &c->layers[L];
    const td_config *cf = &c->cfg;
    const int64_t E = cf->num_experts, H = cf->hidden_size, I = cf->moe_intermediate_size;
    const int64_t Is = cf->shared_expert_intermediate_size;
    const int T = c->base.variant.tp_size;
    char mod[256];
    snprintf(mod, sizeof mod, "%slayers.%lld.mlp.gate", c->prefix, (long long)L);
    td_status st = load_one(c, mod, E, H, &ly->router, err);
    if (st) return st;
    host_lin *h = (host_lin *)calloc((size_t)E, sizeof *h);
    char (*names)[256] = (char (*)[256])calloc((size_t)E, sizeof *names);
    if (!h || !names) {
        free(h);
        free(names);
        return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
    }
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    cu_lin *dst[3] = {&ly->gate, &ly->up, &ly->down};
    for (int p = 0; p < 3 && !st; p++) {
        for (int64_t e = 0; e < E && !st; e++) {
            snprintf(names[e], sizeof names[e], "%slayers.%lld.mlp.experts.%lld.%s", c->prefix, (long long)L,
                     (long long)e, proj[p]);
            if (p == 0 && e == 0) {
                td_quant_tensors q;
                st = td_quant_resolve(&c->quant, names[0], true, &q, err);
                if (!st && !td_st_set_has(c->set, q.weight))
                    st = td_err_set(err, TD_ERR_UNSUPPORTED,
                                    "tensor %s is not in the checkpoint: the cuda engine reads per-expert tensors "
                                    "only (fused expert tensors are not supported yet)",
                                    q.weight);
            }
            if (!st) st = find_linear(c, names[e], p < 2 ? I : H, p < 2 ? H : I, &h[e], err);
        }
        if (!st) st = upload(c, h, E, names, dst[p], err);
    }
    free(h);
    free(names);
    if (st) return st;
    if (Is > 0) {
        snprintf(mod, sizeof mod, "%slayers.%lld.mlp.shared_expert_gate", c->prefix, (long long)L);
        st = load_one(c, mod, 1, H, &ly->sh_gw, err);
        static const char *const sproj[3] = {"gate_proj", "up_proj", "down_proj"};
        cu_lin *sdst[3] = {&ly->sh_gate, &ly->sh_up, &ly->sh_down};
        for (int p = 0; p < 3 && !st; p++) {
            snprintf(mod, sizeof mod, "%slayers.%lld.mlp.shared_expert.%s", c->prefix, (long long)L, sproj[p]);
            st = load_one(c, mod, p < 2 ? Is : H, p < 2 ? H : Is, sdst[p], err);
        }
        if (st) return st;
        ly->has_shared = true;
    }
    if (T > 1) {
        if (ly->down.kind == CU_W_NVFP4 && (I / T) % TD_NVFP4_BLOCK)
            return td_err_set(err, TD_ERR_RANGE,
                              "tp_size %d gives %lld intermediate columns per rank, not a multiple of 16 (NVFP4 "
                              "blocks of the expert down projections)",
                              T, (long long)(I / T));
        if (ly->has_shared && ly->sh_down.kind == CU_W_NVFP4 && (Is / T) % TD_NVFP4_BLOCK)
            return td_err_set(err, TD_ERR_RANGE,
                              "tp_size %d gives %lld shared-expert columns per rank, not a multiple of 16 (NVFP4 "
                              "blocks of shared_expert.down_proj)",
                              T, (long long)(Is / T));
    }
    ly->moe = true;
    return TD_OK;
}

/* ==== interface ============================================================================== */

static void cu_free(td_engine *base)
{
    cu_engine *c = (cu_engine *)base;
    if (!c) return;
    for (size_t i = 0; i < c->n_dmem; i++) cudaFree(c->dmem[i]);
    free(c->dmem);
    if (c->have_stream) cudaStreamDestroy(c->stream);
    free(c->layers);
    free(c->h_ids);
    free(c->h_wts);
    td_st_set_close(c->set);
    td_quant_free(&c->quant);
    free(c);
}

static td_status alloc_ws(cu_engine *c, td_err *err)
{
    const td_config *cf = &c->cfg;
    const size_t C = CU_TOKEN_CAP, H = (size_t)cf->hidden_size, E = (size_t)cf->num_experts;
    const size_t k = (size_t)cf->num_experts_per_tok, T = (size_t)c->base.variant.tp_size;
    const size_t il = (size_t)cf->moe_intermediate_size / T;
    const size_t isl = (size_t)cf->shared_expert_intermediate_size / T;
    const size_t f = sizeof(float);
    struct {
        void **p;
        size_t bytes;
    } b[] = {
        {(void **)&c->x, C * H * f},          {(void **)&c->xa, C * H * f},
        {(void **)&c->logits, C * E * f},     {(void **)&c->wts, C * k * f},
        {(void **)&c->ids, C * k * sizeof(int32_t)},
        {(void **)&c->act, C * k * il * f},   {(void **)&c->eout, C * k * H * f},
        {(void **)&c->sh_act, C * (isl ? isl : 1) * f}, {(void **)&c->sh_out, C * H * f},
        {(void **)&c->sg, C * f},             {(void **)&c->out, C * H * f},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        td_status st = dalloc(c, b[i].bytes, b[i].p, err);
        if (st) return st;
        /* NaN everywhere: a value read before it is written shows up in the output. */
        TD_CU_TRY(err, cudaMemset(*b[i].p, 0xff, b[i].bytes));
    }
    c->h_ids = (int32_t *)malloc(C * k * sizeof(int32_t));
    c->h_wts = (float *)malloc(C * k * f);
    if (!c->h_ids || !c->h_wts) return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
    return TD_OK;
}

static td_status cu_load(const char *checkpoint, const td_variant *v, td_engine **out, td_err *err)
{
    *out = NULL;
    if (v->storage != TD_STORAGE_PREPARED)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "engine cuda: storage=raw is not implemented yet (only storage=prepared); refusing "
                          "rather than running prepared scales under its name");
    if (v->moe_dispatch != TD_DISPATCH_DIRECT)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine cuda: moe_dispatch=grouped is not implemented yet "
                                                   "(only moe_dispatch=direct)");
    if (v->graphs) return td_err_set(err, TD_ERR_UNSUPPORTED, "engine cuda: graphs=on is not implemented yet");
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine cuda: no CUDA device available (%s)",
                          ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    cu_engine *c = (cu_engine *)calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of memory");
    snprintf(c->dir, sizeof c->dir, "%s", checkpoint);
    c->base.variant = *v;
    td_status st = td_config_load(checkpoint, &c->cfg, err);
    if (!st) st = td_quant_load(checkpoint, &c->quant, err);
    if (!st) st = td_st_set_open(checkpoint, &c->set, err);
    if (st) goto fail;
    snprintf(c->prefix, sizeof c->prefix, "%s", td_layout_set_prefix(c->set));
    {
        const td_config *cf = &c->cfg;
        td_engine_model *m = &c->base.model;
        m->family = cf->family;
        m->hidden = cf->hidden_size;
        m->layers = cf->num_hidden_layers;
        m->num_experts = cf->num_experts;
        m->top_k = cf->num_experts_per_tok;
        m->moe_inter = cf->moe_intermediate_size;
        m->shared_inter = cf->shared_expert_intermediate_size;
        m->norm_topk_prob = cf->norm_topk_prob;
        if (v->tp_size > 1 && cf->num_experts > 0 &&
            (cf->moe_intermediate_size % v->tp_size || cf->shared_expert_intermediate_size % v->tp_size)) {
            st = td_err_set(err, TD_ERR_ARG,
                            "engine cuda: tp_size %d does not divide moe_intermediate_size %lld / "
                            "shared_expert_intermediate_size %lld of %s",
                            v->tp_size, (long long)cf->moe_intermediate_size,
                            (long long)cf->shared_expert_intermediate_size, checkpoint);
            goto fail;
        }
        c->layers = (cu_layer *)calloc((size_t)(cf->num_hidden_layers > 0 ? cf->num_hidden_layers : 1),
                                       sizeof *c->layers);
        if (!c->layers) {
            st = td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of memory");
            goto fail;
        }
        ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        if (ce != cudaSuccess) {
            st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: cudaStreamCreateWithFlags: %s", cudaGetErrorString(ce));
            goto fail;
        }
        c->have_stream = true;
        if (cf->num_experts > 0) {
            for (int64_t L = 0; L < cf->num_hidden_layers; L++) {
                if (!td_config_layer_is_moe(cf, L) || !td_config_layer_present(cf, L)) continue;
                st = load_layer(c, L, err);
                if (st) {
                    td_err_prefix(err, "engine cuda: %s: layer %lld: ", checkpoint, (long long)L);
                    goto fail;
                }
            }
            st = alloc_ws(c, err);
            if (st) goto fail;
        }
    }
    *out = &c->base;
    return TD_OK;
fail:
    cu_free(&c->base);
    return st;
}

/* One chunk of at most CU_TOKEN_CAP tokens, enqueued on the engine's stream. */
static td_status run_chunk(cu_engine *c, const cu_layer *ly, const td_block_call *call, int64_t t0, int64_t Mc,
                           td_err *err)
{
    const td_config *cf = &c->cfg;
    const td_variant *v = &c->base.variant;
    const int64_t H = cf->hidden_size, E = cf->num_experts, k = cf->num_experts_per_tok;
    const int T = v->tp_size, act = (int)v->act_dtype;
    const int64_t il = cf->moe_intermediate_size / T, isl = cf->shared_expert_intermediate_size / T;
    cudaStream_t s = c->stream;
    TD_CU_TRY(err, cudaMemcpyAsync(c->x, call->input + t0 * H, (size_t)(Mc * H) * sizeof(float),
                                   cudaMemcpyHostToDevice, s));
    td_status st = cu_moe_round(c->x, c->xa, Mc * H, act, s, err);
    if (st) return st;
    if (call->block == TD_BLOCK_ROUTER) {
        st = cu_moe_linear(ly->router, 0, E, c->xa, H, Mc, c->logits, E, s, err);
        if (st) return st;
        TD_CU_TRY(err, cudaMemcpyAsync(call->output + t0 * E, c->logits, (size_t)(Mc * E) * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
        return TD_OK;
    }
    if (call->route_ids) {
        TD_CU_TRY(err, cudaMemcpyAsync(c->ids, call->route_ids + t0 * k, (size_t)(Mc * k) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, s));
        TD_CU_TRY(err, cudaMemcpyAsync(c->wts, call->route_weights + t0 * k, (size_t)(Mc * k) * sizeof(float),
                                       cudaMemcpyHostToDevice, s));
    } else {
        st = cu_moe_linear(ly->router, 0, E, c->xa, H, Mc, c->logits, E, s, err);
        if (!st) st = cu_moe_route(c->logits, Mc, E, k, cf->norm_topk_prob, c->ids, c->wts, s, err);
        if (st) return st;
    }
    if (ly->has_shared) {
        st = cu_moe_linear(ly->sh_gw, 0, 1, c->xa, H, Mc, c->sg, 1, s, err);
        if (st) return st;
    }
    const bool all = v->tp_rank == TD_TP_RANK_ALL;
    const int r0 = all ? 0 : v->tp_rank, r1 = all ? T : v->tp_rank + 1;
    for (int r = r0; r < r1 && !st; r++) {
        st = cu_moe_w13(ly->gate, ly->up, r * il, il, c->ids, k, Mc * k, c->xa, H, act, c->act, s, err);
        if (!st) st = cu_moe_w2(ly->down, r * il, il, c->ids, Mc * k, c->act, H, act, c->eout, s, err);
        if (!st && ly->has_shared) {
            st = cu_moe_w13(ly->sh_gate, ly->sh_up, r * isl, isl, NULL, 1, Mc, c->xa, H, act, c->sh_act, s, err);
            if (!st) st = cu_moe_w2(ly->sh_down, r * isl, isl, NULL, Mc, c->sh_act, H, act, c->sh_out, s, err);
        }
        if (!st)
            st = cu_moe_combine(c->wts, c->eout, k, ly->has_shared ? c->sg : NULL, c->sh_out, Mc, H, act,
                                r == r0 ? 0 : 1, c->out, s, err);
    }
    if (!st && all) st = cu_moe_round(c->out, c->out, Mc * H, act, s, err);
    if (st) return st;
    TD_CU_TRY(err, cudaMemcpyAsync(call->output + t0 * H, c->out, (size_t)(Mc * H) * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    if (c->base.taps && call->n_tokens <= CU_TOKEN_CAP) {
        TD_CU_TRY(err, cudaMemcpyAsync(c->h_ids, c->ids, (size_t)(Mc * k) * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
        TD_CU_TRY(err, cudaMemcpyAsync(c->h_wts, c->wts, (size_t)(Mc * k) * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    return TD_OK;
}

static td_status cu_run_block(td_engine *base, const td_block_call *call, td_err *err)
{
    cu_engine *c = (cu_engine *)base;
    const int64_t L = call->layer;
    if (call->block != TD_BLOCK_MOE && call->block != TD_BLOCK_ROUTER)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "engine cuda: block '%s' is not implemented yet; implemented: moe, router",
                          td_block_name(call->block));
    const cu_layer *ly = &c->layers[L];
    if (!ly->moe)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine cuda: %s: layer %lld has no MoE block in this checkpoint",
                          c->dir, (long long)L);
    const int64_t M = call->n_tokens, k = c->cfg.num_experts_per_tok, E = c->cfg.num_experts;
    if (call->block == TD_BLOCK_MOE && call->route_ids) {
        for (int64_t s = 0; s < M * k; s++)
            if (call->route_ids[s] < 0 || call->route_ids[s] >= E)
                return td_err_set(err, TD_ERR_RANGE,
                                  "engine cuda: layer %lld: route id %d of token %lld slot %lld is outside [0, %lld)",
                                  (long long)L, (int)call->route_ids[s], (long long)(s / k), (long long)(s % k),
                                  (long long)E);
    }
    for (int64_t t0 = 0; t0 < M; t0 += CU_TOKEN_CAP) {
        const int64_t Mc = M - t0 < CU_TOKEN_CAP ? M - t0 : CU_TOKEN_CAP;
        td_status st = run_chunk(c, ly, call, t0, Mc, err);
        if (st) {
            cudaStreamSynchronize(c->stream);
            return td_err_prefix(err, "engine cuda: layer %lld: ", (long long)L);
        }
    }
    TD_CU_TRY(err, cudaStreamSynchronize(c->stream));
    if (base->taps) {
        td_status st = TD_OK;
        const int64_t H = c->cfg.hidden_size;
        if (call->block == TD_BLOCK_ROUTER) {
            const int64_t sh[2] = {M, E};
            return td_engine_put_tap(base, L, "moe.router_logits", TD_F32, 2, sh, call->output, err);
        }
        if (M <= CU_TOKEN_CAP) {
            const int64_t sk[2] = {M, k};
            st = td_engine_put_tap(base, L, "moe.topk", TD_I32, 2, sk, c->h_ids, err);
            if (!st) st = td_engine_put_tap(base, L, "moe.topk_weights", TD_F32, 2, sk, c->h_wts, err);
        }
        const int64_t sh[2] = {M, H};
        if (!st) st = td_engine_put_tap(base, L, "moe.out", TD_F32, 2, sh, call->output, err);
        return st;
    }
    return TD_OK;
}

static td_status cu_prefill(td_engine *e, int64_t seq, const int32_t *tokens, int64_t n, float *logits, td_err *err)
{
    (void)e;
    (void)seq;
    (void)tokens;
    (void)n;
    (void)logits;
    return td_err_set(err, TD_ERR_UNSUPPORTED,
                      "engine cuda: prefill is not implemented yet (it arrives with the full-model issues); "
                      "per-layer audits use run_block");
}

static td_status cu_decode(td_engine *e, const td_decode_item *batch, int64_t n, float *logits, td_err *err)
{
    (void)e;
    (void)batch;
    (void)n;
    (void)logits;
    return td_err_set(err, TD_ERR_UNSUPPORTED,
                      "engine cuda: decode is not implemented yet (it arrives with the full-model issues); "
                      "per-layer audits use run_block");
}

extern "C" const td_engine_ops td_cuda_engine_ops = {
    "cuda", cu_load, cu_run_block, cu_prefill, cu_decode, cu_free,
};
