/* engine_cuda.cu — the CUDA engine `cuda` (engine.h contract): loads a checkpoint's MoE layers
 * onto the GPU and runs the MoE block and the router (cuda/moe_block.cuh: the launch sequence;
 * cuda/moe.cuh and cuda/moe_mma.cuh: the kernels and their numerics).
 *
 * Loading: config.json, the quantization metadata and every MoE layer's tensors are read at
 * load through core/modview.h (dtype, shape, scalar globals checked, errors naming the
 * tensor), the TP slices checked for NVFP4 alignment, and the weights copied to device memory:
 * - act_dtype fp16|bf16 with NVFP4 or BF16 weights: the tensor-core layout of moe_mma.cuh
 *   (packed at load; the ranks this variant runs only), the router and the shared-expert gate
 *   as one BF16 matrix;
 * - otherwise (act_dtype fp32, or F16/F32 weights): row-major copies for the CUDA-core
 *   kernels of moe.cuh.
 * NVFP4 scales are prepared FP16 effective scales (eff = fp16_rn(fl32(E4M3 S x g_dec)) for
 * ModelOpt, fp16_rn(fl32(E4M3 S / g_enc)) for compressed-tensors; the reference's scale=fp16
 * values), or with storage=raw the E4M3 bytes plus the globals, admitted first (admit_raw:
 * SEED_AUDITS.md §2.6 plus finiteness and range, core/e4m3_recon.h) or refused with
 * TD_ERR_RANGE naming the first failing element. The workspace for CU_TOKEN_CAP tokens, two
 * streams and two events are created at load: run_block never allocates device memory; larger
 * calls run in chunks of CU_TOKEN_CAP tokens (tokens are independent in the block, so
 * chunking changes no bit). graphs=on captures a chunk's device work once per (layer, tokens,
 * block, routes imposed or not) and replays it. moe_dispatch=grouped runs on the tensor-core
 * path only and is refused (TD_ERR_UNSUPPORTED, naming why) elsewhere. The tensor-core path
 * keeps its intermediates as 16-bit patterns only (moe_block.cuh); the taps moe.expert_act,
 * moe.expert_out and moe.shared_out convert them to float on the host (exact), for calls of
 * one chunk; the routing taps (moe.topk, moe.topk_weights, moe.router_logits) come at every
 * call size, each chunk copying its tokens'.
 *
 * Errors name the engine, layer and tensor or CUDA call at fault. One engine owns its streams,
 * events, graphs and device memory; nothing global.
 */
extern "C" {
#include "engine.h"
#include "config.h"
#include "formats.h"
#include "layout.h"
#include "quant.h"
#include "safetensors.h"
#include "nvfp4.h"
#include "e4m3_recon.h"
#include "modview.h"
}
#include "moe.cuh"
#include "moe_block.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per chunk of one run_block: the workspace is sized for this many at load. */
#define CU_TOKEN_CAP 1024
/* Instantiated graphs kept per engine (one per layer, chunk size, block and routing). */
#define CU_GRAPHS 64

typedef struct cu_layer {
    bool moe;
    cu_block_w w;
} cu_layer;

typedef struct cu_graph {
    int64_t layer, M;
    int block;
    bool routed;                /* routes imposed by the caller (no router in the graph) */
    cudaGraphExec_t exec;
} cu_graph;

typedef struct cu_engine {
    td_engine base;             /* first member: the interface's view */
    char dir[1024];
    td_config cfg;
    td_quant quant;
    td_st_set *set;
    char prefix[64];
    cu_layer *layers;           /* [num_hidden_layers] */
    bool mm_act;                /* act_dtype fp16|bf16: tensor-core path where weights allow */
    bool have_stream;
    void **dmem;                /* every device allocation, freed at the end */
    size_t n_dmem, cap_dmem;
    cu_block_shape shape;       /* the variant, as the block launcher needs it */
    cu_block_ws ws;             /* workspace (device) for CU_TOKEN_CAP tokens, streams, events */
    bool have_stream2, have_events;
    /* host staging for taps (allocated on first use); the routing's (h_ids, h_wts, h_logits)
     * for route_cap tokens, any call size; the others for one chunk */
    int32_t *h_ids;
    float *h_wts, *h_logits, *h_act, *h_eout, *h_sh;
    int64_t route_cap;
    uint16_t *h_16;             /* 16-bit intermediates on their way to h_act, h_eout, h_sh */
    cu_graph graphs[CU_GRAPHS];
    int n_graphs, next_graph;
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

static td_status find_linear(cu_engine *c, const char *module, int64_t rows, int64_t cols, host_lin *out,
                             td_err *err)
{
    td_module_view v;
    td_status st = td_module_view_get(c->set, &c->quant, module, rows, cols, &v, err);
    if (st) return st;
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    out->w = (const uint8_t *)v.w;
    if (v.nvfp4) {
        out->kind = CU_W_NVFP4;
        out->s = v.scales;
        out->global = v.global;
        out->conv = v.conv;
    } else {
        out->kind = v.dtype == TD_BF16 ? CU_W_BF16 : v.dtype == TD_F16 ? CU_W_F16 : CU_W_F32;
    }
    return TD_OK;
}

static int64_t elem_bytes(int kind) { return kind == CU_W_F32 ? 4 : 2; }

/* ==== raw-storage admission ================================================================== */

/* SEED_AUDITS.md §2.6 plus finiteness and range (core/e4m3_recon.h td_recon_admit_tensor):
 * every block scale of an NVFP4 tensor kept raw must reproduce the prepared FP16 scale through
 * the strict and the fast reconstruction, with a finite, positive, normal effective scale. */
static td_status admit_raw(const host_lin *h, const char *module, td_err *err)
{
    if (h->kind != CU_W_NVFP4) return TD_OK;
    const int64_t nb = h->cols / TD_NVFP4_BLOCK, n = h->rows * nb;
    int64_t first = -1;
    td_scale_reason why = TD_SCALE_OK;
    const int64_t bad = td_recon_admit_tensor(h->s, n, td_nvfp4_g_dec(h->global, h->conv), &first, &why);
    if (!bad) return TD_OK;
    const uint8_t code = h->s[first];
    return td_err_set(err, TD_ERR_RANGE,
                      "storage=raw refused: %s.weight_scale[%lld, %lld] = 0x%02x (global %.9g) fails the raw-storage "
                      "admission (reason %s; %lld of %lld block scales of this tensor fail): raw E4M3 storage would not "
                      "reproduce the prepared FP16 scales bit for bit; use storage=prepared",
                      module, (long long)(first / nb), (long long)(first % nb), code, (double)h->global,
                      td_scale_reason_name(why), (long long)bad, (long long)n);
}

/* ==== CUDA-core path: plain row-major copies ================================================= */

/* Copy n modules of one shape and kind to the device back to back (NVFP4: prepared FP16
 * scales, or with raw storage the codes and one global per module). `names` [n] name the
 * modules for errors. */
static td_status upload(cu_engine *c, const host_lin *h, int64_t n, char (*names)[256], cu_lin *out, td_err *err)
{
    const int64_t rows = h[0].rows, cols = h[0].cols;
    for (int64_t i = 1; i < n; i++)
        if (h[i].kind != h[0].kind || (h[0].kind == CU_W_NVFP4 && h[i].conv != h[0].conv))
            return td_err_set(err, TD_ERR_UNSUPPORTED,
                              "module %s is stored as %s but %s as %s: the cuda engine needs one storage per projection",
                              names[i], h[i].kind == CU_W_NVFP4 ? "NVFP4" : "dense", names[0],
                              h[0].kind == CU_W_NVFP4 ? "NVFP4" : "dense");
    memset(out, 0, sizeof *out);
    out->kind = h[0].kind;
    out->rows = rows;
    out->cols = cols;
    void *dw = NULL, *ds = NULL, *dg = NULL;
    if (h[0].kind == CU_W_NVFP4) {
        const bool raw = c->base.variant.storage == TD_STORAGE_RAW;
        out->w_ld = cols / 2;
        out->s_ld = cols / TD_NVFP4_BLOCK;
        out->e_w = rows * out->w_ld;
        out->e_s = rows * out->s_ld;
        out->raw = raw;
        out->conv = h[0].conv == TD_NVFP4_CT;
        td_status st = dalloc(c, (size_t)(n * out->e_w), &dw, err);
        if (!st) st = dalloc(c, (size_t)(n * out->e_s) * (raw ? 1 : sizeof(uint16_t)), &ds, err);
        if (!st && raw) st = dalloc(c, (size_t)n * sizeof(float), &dg, err);
        if (st) return st;
        uint16_t *tmp = (uint16_t *)malloc((size_t)out->e_s * sizeof *tmp);
        float *gl = (float *)malloc((size_t)n * sizeof *gl);
        if (!tmp || !gl) {
            free(tmp);
            free(gl);
            return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
        }
        for (int64_t i = 0; i < n && !st; i++) {
            if (raw) st = admit_raw(&h[i], names[i], err);
            if (st) break;
            gl[i] = h[i].global;
            cudaError_t e1 = cudaMemcpy((uint8_t *)dw + i * out->e_w, h[i].w, (size_t)out->e_w, cudaMemcpyHostToDevice);
            if (e1 == cudaSuccess && raw) {
                e1 = cudaMemcpy((uint8_t *)ds + i * out->e_s, h[i].s, (size_t)out->e_s, cudaMemcpyHostToDevice);
            } else if (e1 == cudaSuccess) {
                for (int64_t j = 0; j < out->e_s; j++)
                    tmp[j] = td_f32_to_f16(td_nvfp4_block_factor(h[i].s[j], h[i].global, h[i].conv));
                e1 = cudaMemcpy((uint16_t *)ds + i * out->e_s, tmp, (size_t)out->e_s * sizeof *tmp,
                                cudaMemcpyHostToDevice);
            }
            if (e1 != cudaSuccess)
                st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: copying %s to the device: %s", names[i],
                                cudaGetErrorString(e1));
        }
        if (!st && raw) {
            cudaError_t e1 = cudaMemcpy(dg, gl, (size_t)n * sizeof *gl, cudaMemcpyHostToDevice);
            if (e1 != cudaSuccess)
                st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: copying globals: %s", cudaGetErrorString(e1));
        }
        free(tmp);
        free(gl);
        if (st) return st;
        out->w = (const uint8_t *)dw;
        if (raw) {
            out->sr = (const uint8_t *)ds;
            out->gl = (const float *)dg;
        } else {
            out->s = (const __half *)ds;
        }
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

/* ==== tensor-core path: fragment-ordered packing ============================================== */

static bool mm_kind(int kind) { return kind == CU_W_NVFP4 || kind == CU_W_BF16; }

/* Pack n experts (W13: gate hg and up hu; W2: down hg with hu NULL) for the ranks this engine
 * stores (c->shape.nr from c->shape.rank0; intermediate slice il per rank) into out. */
static td_status pack_set(cu_engine *c, const host_lin *hg, const host_lin *hu, int64_t n, int64_t il,
                          char (*names)[256], char (*unames)[256], cu_qmat *out, td_err *err)
{
    const bool w13 = hu != NULL;
    const int kind = hg[0].kind;
    const bool raw = kind == CU_W_NVFP4 && c->base.variant.storage == TD_STORAGE_RAW;
    for (int64_t i = 0; i < n; i++)
        if (hg[i].kind != kind || (hu && hu[i].kind != kind) ||
            (kind == CU_W_NVFP4 && (hg[i].conv != hg[0].conv || (hu && hu[i].conv != hg[0].conv))))
            return td_err_set(err, TD_ERR_UNSUPPORTED,
                              "module %s is stored differently from %s: the cuda engine needs one storage per block",
                              names[i], names[0]);
    const int64_t H = w13 ? hg[0].cols : hg[0].rows;
    const int64_t rows = w13 ? 16 * ((il + 7) / 8) : H, cols = w13 ? H : il;
    int64_t R, K, wb, sp, sr;
    cu_qmat_geometry(kind, rows, cols, &R, &K, &wb, &sp, &sr);
    const int64_t sb = kind == CU_W_NVFP4 ? (raw ? sr : sp) : 0;
    const int64_t nm = n * c->shape.nr;
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->raw = raw;
    out->conv = kind == CU_W_NVFP4 && hg[0].conv == TD_NVFP4_CT;
    /* NVFP4 words in the placement of the engine's act_dtype (moe_mma.cuh) */
    out->bf16_words = kind == CU_W_NVFP4 && c->base.variant.act_dtype == TD_ACT_BF16;
    out->rows = rows;
    out->cols = cols;
    out->R = R;
    out->K = K;
    out->mat_w = wb;
    out->mat_s = sb;
    void *dw = NULL, *ds = NULL, *dg = NULL;
    td_status st = dalloc(c, (size_t)(nm * wb), &dw, err);
    if (!st && sb) st = dalloc(c, (size_t)(nm * sb), &ds, err);
    if (!st && raw) st = dalloc(c, (size_t)nm * sizeof(float2), &dg, err);
    if (st) return st;
    uint8_t *hw = (uint8_t *)malloc((size_t)wb), *hs = (uint8_t *)malloc((size_t)(sb ? sb : 1));
    const void **rw = (const void **)calloc((size_t)rows, sizeof *rw);
    const uint8_t **rs = (const uint8_t **)calloc((size_t)rows, sizeof *rs);
    float *rg = (float *)calloc((size_t)rows, sizeof *rg);
    float2 *gl = (float2 *)calloc((size_t)nm, sizeof *gl);
    if (!hw || !hs || !rw || !rs || !rg || !gl) st = td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
    for (int64_t e = 0; e < n && !st; e++) {
        if (raw) {
            st = admit_raw(&hg[e], names[e], err);
            if (!st && hu) st = admit_raw(&hu[e], unames[e], err);
            if (st) break;
        }
        for (int ri = 0; ri < c->shape.nr && !st; ri++) {
            const int64_t r = c->shape.rank0 + ri, m = e * c->shape.nr + ri;
            for (int64_t i = 0; i < rows; i++) {
                const host_lin *src;
                int64_t row, col0;
                if (w13) {
                    const int64_t cc = 8 * (i / 16) + (i % 8);
                    rw[i] = NULL;
                    rs[i] = NULL;
                    if (cc >= il) continue;
                    src = (i % 16) < 8 ? &hg[e] : &hu[e];
                    row = r * il + cc;
                    col0 = 0;
                } else {
                    src = &hg[e];
                    row = i;
                    col0 = r * il;
                }
                if (kind == CU_W_NVFP4) {
                    rw[i] = src->w + row * (src->cols / 2) + col0 / 2;
                    rs[i] = src->s + row * (src->cols / TD_NVFP4_BLOCK) + col0 / TD_NVFP4_BLOCK;
                } else {
                    rw[i] = (const uint16_t *)src->w + row * src->cols + col0;
                }
                rg[i] = src->global;
            }
            if (kind == CU_W_NVFP4)
                cu_pack_nvfp4((const uint8_t *const *)rw, rs, rg, out->conv, raw, out->bf16_words, rows, cols, hw, hs);
            else
                cu_pack_bf16((const uint16_t *const *)rw, rows, cols, hw);
            gl[m] = w13 ? make_float2(hg[e].global, hu[e].global) : make_float2(hg[e].global, hg[e].global);
            cudaError_t e1 = cudaMemcpy((uint8_t *)dw + m * wb, hw, (size_t)wb, cudaMemcpyHostToDevice);
            if (e1 == cudaSuccess && sb) e1 = cudaMemcpy((uint8_t *)ds + m * sb, hs, (size_t)sb, cudaMemcpyHostToDevice);
            if (e1 != cudaSuccess)
                st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: copying %s to the device: %s", names[e],
                                cudaGetErrorString(e1));
        }
    }
    if (!st && raw) {
        cudaError_t e1 = cudaMemcpy(dg, gl, (size_t)nm * sizeof *gl, cudaMemcpyHostToDevice);
        if (e1 != cudaSuccess)
            st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: copying globals: %s", cudaGetErrorString(e1));
    }
    free(hw);
    free(hs);
    free(rw);
    free(rs);
    free(rg);
    free(gl);
    if (st) return st;
    out->w = (const uint8_t *)dw;
    out->s = (const uint8_t *)ds;
    out->g = (const float2 *)dg;
    return TD_OK;
}

/* The router [E, H] and, when there is one, the shared-expert gate [1, H] as row E of one
 * BF16 matrix on the tensor-core path (act_dtype fp16|bf16 and BF16 weights only). */
static td_status pack_router(cu_engine *c, int64_t L, cu_block_w *ly, bool shared, td_err *err)
{
    const int64_t E = c->cfg.num_experts, H = c->cfg.hidden_size;
    char mod[256];
    host_lin r, g;
    snprintf(mod, sizeof mod, "%slayers.%lld.mlp.gate", c->prefix, (long long)L);
    td_status st = find_linear(c, mod, E, H, &r, err);
    if (st || r.kind != CU_W_BF16) return st;
    if (shared) {
        snprintf(mod, sizeof mod, "%slayers.%lld.mlp.shared_expert_gate", c->prefix, (long long)L);
        st = find_linear(c, mod, 1, H, &g, err);
        if (st || g.kind != CU_W_BF16) return st;
    }
    const int64_t rows = E + (shared ? 1 : 0);
    int64_t R, K, wb, sp, sr;
    cu_qmat_geometry(CU_W_BF16, rows, H, &R, &K, &wb, &sp, &sr);
    const uint16_t **rw = (const uint16_t **)calloc((size_t)rows, sizeof *rw);
    uint8_t *hw = (uint8_t *)malloc((size_t)wb);
    if (!rw || !hw) {
        free(rw);
        free(hw);
        return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
    }
    for (int64_t i = 0; i < E; i++) rw[i] = (const uint16_t *)r.w + i * H;
    if (shared) rw[E] = (const uint16_t *)g.w;
    cu_pack_bf16(rw, rows, H, hw);
    void *dw = NULL;
    st = dalloc(c, (size_t)wb, &dw, err);
    if (!st) {
        cudaError_t ce = cudaMemcpy(dw, hw, (size_t)wb, cudaMemcpyHostToDevice);
        if (ce != cudaSuccess)
            st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: copying the router: %s", cudaGetErrorString(ce));
    }
    free(rw);
    free(hw);
    if (st) return st;
    cu_qmat *q = &ly->router_q;
    memset(q, 0, sizeof *q);
    q->kind = CU_W_BF16;
    q->rows = rows;
    q->cols = H;
    q->R = R;
    q->K = K;
    q->w = (const uint8_t *)dw;
    q->mat_w = wb;
    ly->router_mm = true;
    return TD_OK;
}

/* ==== layers ================================================================================= */

static td_status load_layer(cu_engine *c, int64_t L, td_err *err)
{
    cu_block_w *ly = &c->layers[L].w;
    const td_config *cf = &c->cfg;
    const td_variant *v = &c->base.variant;
    const int64_t E = cf->num_experts, H = cf->hidden_size, I = cf->moe_intermediate_size;
    const int64_t Is = cf->shared_expert_intermediate_size;
    const int T = v->tp_size;
    char mod[256];
    snprintf(mod, sizeof mod, "%slayers.%lld.mlp.gate", c->prefix, (long long)L);
    td_status st = load_one(c, mod, E, H, &ly->router, err);
    if (st) return st;
    host_lin *h = (host_lin *)calloc((size_t)(3 * E), sizeof *h);
    char (*names)[256] = (char (*)[256])calloc((size_t)(3 * E), sizeof *names);
    if (!h || !names) {
        free(h);
        free(names);
        return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory");
    }
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int p = 0; p < 3 && !st; p++) {
        for (int64_t e = 0; e < E && !st; e++) {
            char *nm = names[p * E + e];
            snprintf(nm, 256, "%slayers.%lld.mlp.experts.%lld.%s", c->prefix, (long long)L, (long long)e, proj[p]);
            if (p == 0 && e == 0) {
                td_quant_tensors q;
                st = td_quant_resolve(&c->quant, nm, true, &q, err);
                if (!st && !td_st_set_has(c->set, q.weight))
                    st = td_err_set(err, TD_ERR_UNSUPPORTED,
                                    "tensor %s is not in the checkpoint: the cuda engine reads per-expert tensors "
                                    "only (fused expert tensors are not supported yet)",
                                    q.weight);
            }
            if (!st) st = find_linear(c, nm, p < 2 ? I : H, p < 2 ? H : I, &h[p * E + e], err);
        }
    }
    if (!st && v->storage == TD_STORAGE_RAW && h[0].kind != CU_W_NVFP4)
        st = td_err_set(err, TD_ERR_UNSUPPORTED,
                        "storage=raw applies to NVFP4 expert weights; %s is stored dense", names[0]);
    if (!st && T > 1 && h[2 * E].kind == CU_W_NVFP4 && (I / T) % TD_NVFP4_BLOCK)
        st = td_err_set(err, TD_ERR_RANGE,
                        "tp_size %d gives %lld intermediate columns per rank, not a multiple of 16 (NVFP4 blocks of "
                        "the expert down projections)",
                        T, (long long)(I / T));
    ly->mm = c->mm_act && mm_kind(h[0].kind);
    if (!st && v->moe_dispatch == TD_DISPATCH_GROUPED && !ly->mm)
        st = td_err_set(err, TD_ERR_UNSUPPORTED,
                        "moe_dispatch=grouped runs on the tensor-core path only (act_dtype=fp16|bf16 with NVFP4 or "
                        "BF16 experts); this variant has act_dtype=%s and %s experts",
                        td_act_dtype_name(v->act_dtype), h[0].kind == CU_W_NVFP4 ? "NVFP4" : "dense");
    if (!st && ly->mm) {
        st = pack_set(c, h, h + E, E, I / T, names, names + E, &ly->w13, err);
        if (!st) st = pack_set(c, h + 2 * E, NULL, E, I / T, names + 2 * E, NULL, &ly->w2, err);
    } else if (!st) {
        cu_lin *dst[3] = {&ly->gate, &ly->up, &ly->down};
        for (int p = 0; p < 3 && !st; p++) st = upload(c, h + p * E, E, names + p * E, dst[p], err);
    }
    free(h);
    free(names);
    if (st) return st;
    if (Is > 0) {
        snprintf(mod, sizeof mod, "%slayers.%lld.mlp.shared_expert_gate", c->prefix, (long long)L);
        st = load_one(c, mod, 1, H, &ly->sh_gw, err);
        host_lin sh[3];
        char snames[3][256];
        static const char *const sproj[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int p = 0; p < 3 && !st; p++) {
            snprintf(snames[p], sizeof snames[p], "%slayers.%lld.mlp.shared_expert.%s", c->prefix, (long long)L,
                     sproj[p]);
            st = find_linear(c, snames[p], p < 2 ? Is : H, p < 2 ? H : Is, &sh[p], err);
        }
        if (!st && T > 1 && sh[2].kind == CU_W_NVFP4 && (Is / T) % TD_NVFP4_BLOCK)
            st = td_err_set(err, TD_ERR_RANGE,
                            "tp_size %d gives %lld shared-expert columns per rank, not a multiple of 16 (NVFP4 "
                            "blocks of shared_expert.down_proj)",
                            T, (long long)(Is / T));
        if (st) return st;
        ly->sh_mm = c->mm_act && mm_kind(sh[0].kind) && sh[1].kind == sh[0].kind && sh[2].kind == sh[0].kind;
        if (ly->sh_mm) {
            st = pack_set(c, &sh[0], &sh[1], 1, Is / T, snames, snames + 1, &ly->sh13, err);
            if (!st) st = pack_set(c, &sh[2], NULL, 1, Is / T, snames + 2, NULL, &ly->sh2, err);
        } else {
            cu_lin *sdst[3] = {&ly->sh_gate, &ly->sh_up, &ly->sh_down};
            for (int p = 0; p < 3 && !st; p++) st = upload(c, &sh[p], 1, snames + p, sdst[p], err);
        }
        if (st) return st;
        ly->has_shared = true;
    }
    if (c->mm_act) {
        st = pack_router(c, L, ly, ly->has_shared, err);
        if (st) return st;
    }
    c->layers[L].moe = true;
    return TD_OK;
}

/* ==== interface ============================================================================== */

static void drop_graphs(cu_engine *c)
{
    for (int i = 0; i < c->n_graphs; i++) cudaGraphExecDestroy(c->graphs[i].exec);
    c->n_graphs = 0;
    c->next_graph = 0;
}

static void cu_free(td_engine *base)
{
    cu_engine *c = (cu_engine *)base;
    if (!c) return;
    drop_graphs(c);
    for (size_t i = 0; i < c->n_dmem; i++) cudaFree(c->dmem[i]);
    free(c->dmem);
    if (c->have_stream) cudaStreamDestroy(c->ws.s);
    if (c->have_stream2) cudaStreamDestroy(c->ws.s2);
    if (c->have_events) {
        cudaEventDestroy(c->ws.ev_fork);
        cudaEventDestroy(c->ws.ev_join);
    }
    free(c->layers);
    free(c->h_ids);
    free(c->h_wts);
    free(c->h_logits);
    free(c->h_act);
    free(c->h_eout);
    free(c->h_sh);
    free(c->h_16);
    td_st_set_close(c->set);
    td_quant_free(&c->quant);
    free(c);
}

static td_status alloc_ws(cu_engine *c, td_err *err)
{
    const td_config *cf = &c->cfg;
    cu_block_ws *w = &c->ws;
    const size_t C = CU_TOKEN_CAP, H = (size_t)cf->hidden_size, E = (size_t)cf->num_experts;
    const size_t k = (size_t)cf->num_experts_per_tok, T = (size_t)c->base.variant.tp_size;
    const size_t il = (size_t)cf->moe_intermediate_size / T;
    const size_t isl = (size_t)cf->shared_expert_intermediate_size / T;
    const size_t f = sizeof(float), i4 = sizeof(int32_t);
    const size_t G = (size_t)cu_mm_group_ws((int64_t)C, (int64_t)k, (int64_t)E);
    w->lg_ld = (int64_t)E + 1;
    struct {
        void **p;
        size_t bytes;
    } b[] = {
        {(void **)&w->x, C * H * f},          {(void **)&w->xa, C * H * f},
        {(void **)&w->logits, C * (E + 1) * f}, {(void **)&w->wts, C * k * f},
        {(void **)&w->ids, C * k * i4},
        {(void **)&w->act, C * k * il * f},   {(void **)&w->eout, C * k * H * f},
        {(void **)&w->sh_act, C * (isl ? isl : 1) * f}, {(void **)&w->sh_out, C * H * f},
        {(void **)&w->out, C * H * f},
        {(void **)&w->xa16, C * H * 2},       {(void **)&w->act16, C * k * il * 2},
        {(void **)&w->sh_act16, C * (isl ? isl : 1) * 2},
        {(void **)&w->eout16, C * k * H * 2},  {(void **)&w->sh_out16, C * H * 2},
        {(void **)&w->n_groups, i4},          {(void **)&w->g_mat, G * i4},
        {(void **)&w->g_start, G * i4},       {(void **)&w->g_count, G * i4},
        {(void **)&w->perm, C * k * i4},
        {(void **)&w->sp_x, (size_t)cu_mm_input_ws_bytes((int64_t)C, (int64_t)H)},
        {(void **)&w->sp_sh, (size_t)cu_mm_split_bytes((int64_t)C, (int64_t)(isl > H ? isl : H))},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        td_status st = dalloc(c, b[i].bytes, b[i].p, err);
        if (st) return st;
        /* NaN everywhere: a value read before it is written shows up in the output. */
        TD_CU_TRY(err, cudaMemset(*b[i].p, 0xff, b[i].bytes));
    }
    return TD_OK;
}

static td_status cu_load(const char *checkpoint, const td_variant *v, td_engine **out, td_err *err)
{
    *out = NULL;
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine cuda: no CUDA device available (%s)",
                          ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    cu_engine *c = (cu_engine *)calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of memory");
    snprintf(c->dir, sizeof c->dir, "%s", checkpoint);
    cu_describe_device(&c->base.device);
    c->base.variant = *v;
    c->mm_act = v->act_dtype == TD_ACT_FP16 || v->act_dtype == TD_ACT_BF16;
    c->shape.nr = v->tp_rank == TD_TP_RANK_ALL ? v->tp_size : 1;
    c->shape.rank0 = v->tp_rank == TD_TP_RANK_ALL ? 0 : v->tp_rank;
    td_status st = cu_mm_init(err);
    if (!st) st = td_config_load(checkpoint, &c->cfg, err);
    if (!st) st = td_quant_load(checkpoint, &c->quant, err);
    if (!st) st = td_st_set_open(checkpoint, &c->set, err);
    if (st) goto fail;
    snprintf(c->prefix, sizeof c->prefix, "%s", td_layout_set_prefix(c->set));
    {
        const td_config *cf = &c->cfg;
        td_engine_model_from_config(cf, &c->base.model);
        if ((st = td_engine_check_tp(cf, v->tp_size, "cuda", checkpoint, err))) goto fail;
        cu_block_shape *bs = &c->shape;
        bs->H = cf->hidden_size;
        bs->E = cf->num_experts;
        bs->k = cf->num_experts_per_tok;
        bs->I = cf->moe_intermediate_size;
        bs->Is = cf->shared_expert_intermediate_size;
        bs->renorm = cf->norm_topk_prob;
        bs->act = (int)v->act_dtype;
        bs->tp_size = v->tp_size;
        bs->tp_rank = v->tp_rank == TD_TP_RANK_ALL ? -1 : v->tp_rank;
        bs->grouped = v->moe_dispatch == TD_DISPATCH_GROUPED;
        bs->generic = v->generic;
        bs->dec_narrow = true; /* where td_dec_narrow_pays takes them (cuda/dec_split.h) */
        bs->stage_img = true;  /* the round stages the input for the router's k_mm blocks */
        c->layers = (cu_layer *)calloc((size_t)(cf->num_hidden_layers > 0 ? cf->num_hidden_layers : 1),
                                       sizeof *c->layers);
        if (!c->layers) {
            st = td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of memory");
            goto fail;
        }
        ce = cudaStreamCreateWithFlags(&c->ws.s, cudaStreamNonBlocking);
        if (ce != cudaSuccess) {
            st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: cudaStreamCreateWithFlags: %s", cudaGetErrorString(ce));
            goto fail;
        }
        c->have_stream = true;
        ce = cudaStreamCreateWithFlags(&c->ws.s2, cudaStreamNonBlocking);
        if (ce == cudaSuccess) c->have_stream2 = true;
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&c->ws.ev_fork, cudaEventDisableTiming);
        if (ce == cudaSuccess) {
            ce = cudaEventCreateWithFlags(&c->ws.ev_join, cudaEventDisableTiming);
            if (ce == cudaSuccess) c->have_events = true;
            else cudaEventDestroy(c->ws.ev_fork);
        }
        if (ce != cudaSuccess) {
            st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: creating the second stream: %s", cudaGetErrorString(ce));
            goto fail;
        }
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
        /* The weights' uploads (cudaMemcpy from pageable memory may return before its DMA
         * ends) and the workspace's NaN poison (cudaMemset) ran on the legacy default stream,
         * which the block's non-blocking streams do not wait for: a first call could read
         * weights not yet there, or have its outputs overwritten by the poison (seen as NaN
         * outputs while other processes kept the GPU busy). They complete here. */
        ce = cudaDeviceSynchronize();
        if (ce != cudaSuccess) {
            st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: %s: completing the uploads: %s", checkpoint,
                            cudaGetErrorString(ce));
            goto fail;
        }
    }
    *out = &c->base;
    return TD_OK;
fail:
    cu_free(&c->base);
    return st;
}

/* The chunk's device work: the block itself lives in moe_block.cu (shared with the bench). */
static td_status enqueue_chunk(cu_engine *c, const cu_layer *ly, td_block block, bool routed, int64_t Mc,
                               td_err *err)
{
    return cu_moe_block(&c->shape, &ly->w, &c->ws, block == TD_BLOCK_ROUTER ? CU_BLOCK_ROUTER : CU_BLOCK_MOE, routed,
                        Mc, err);
}

/* Run enqueue_chunk directly, or through a cached graph with graphs=on. */
static td_status run_work(cu_engine *c, int64_t L, const cu_layer *ly, td_block block, bool routed, int64_t Mc,
                          td_err *err)
{
    if (!c->base.variant.graphs) return enqueue_chunk(c, ly, block, routed, Mc, err);
    for (int i = 0; i < c->n_graphs; i++) {
        const cu_graph *g = &c->graphs[i];
        if (g->layer == L && g->M == Mc && g->block == (int)block && g->routed == routed) {
            TD_CU_TRY(err, cudaGraphLaunch(g->exec, c->ws.s));
            return TD_OK;
        }
    }
    cudaGraph_t graph = NULL;
    TD_CU_TRY(err, cudaStreamBeginCapture(c->ws.s, cudaStreamCaptureModeThreadLocal));
    td_status st = enqueue_chunk(c, ly, block, routed, Mc, err);
    cudaError_t ce = cudaStreamEndCapture(c->ws.s, &graph);
    if (st) {
        if (graph) cudaGraphDestroy(graph);
        return st;
    }
    if (ce != cudaSuccess)
        return td_err_set(err, TD_ERR_INTERNAL, "engine cuda: capturing a graph: %s", cudaGetErrorString(ce));
    cudaGraphExec_t exec = NULL;
    ce = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ce != cudaSuccess)
        return td_err_set(err, TD_ERR_INTERNAL, "engine cuda: instantiating a graph: %s", cudaGetErrorString(ce));
    int slot;
    if (c->n_graphs < CU_GRAPHS) {
        slot = c->n_graphs++;
    } else {
        slot = c->next_graph;
        c->next_graph = (c->next_graph + 1) % CU_GRAPHS;
        cudaGraphExecDestroy(c->graphs[slot].exec);
    }
    cu_graph *g = &c->graphs[slot];
    g->layer = L;
    g->M = Mc;
    g->block = (int)block;
    g->routed = routed;
    g->exec = exec;
    TD_CU_TRY(err, cudaGraphLaunch(exec, c->ws.s));
    return TD_OK;
}

static bool wants(const cu_engine *c, int64_t L, const char *suffix)
{
    if (!c->base.taps) return false;
    char name[TD_TAP_NAME_MAX];
    td_tap_name(name, sizeof name, L, suffix);
    return td_taps_wants(c->base.taps, name);
}

static td_status host_buf(void **p, size_t bytes, td_err *err)
{
    if (*p) return TD_OK;
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory for taps");
    return TD_OK;
}

/* The routing taps' host staging for a call of M tokens (at least one chunk's; grown, never
 * shrunk): every chunk copies its ids, weights and logits in at its first token. */
static td_status route_bufs(cu_engine *c, int64_t M, td_err *err)
{
    if (M <= c->route_cap) return TD_OK;
    const size_t n = (size_t)(M > CU_TOKEN_CAP ? M : CU_TOKEN_CAP), k = (size_t)c->cfg.num_experts_per_tok,
                 E = (size_t)c->cfg.num_experts;
    void *ids = realloc(c->h_ids, n * k * sizeof(int32_t));
    if (ids) c->h_ids = (int32_t *)ids;
    void *wts = ids ? realloc(c->h_wts, n * k * sizeof(float)) : NULL;
    if (wts) c->h_wts = (float *)wts;
    void *lg = wts ? realloc(c->h_logits, n * E * sizeof(float)) : NULL;
    if (lg) c->h_logits = (float *)lg;
    if (!lg) return td_err_set(err, TD_ERR_NOMEM, "engine cuda: out of host memory for the routing taps of %lld tokens",
                               (long long)M);
    c->route_cap = (int64_t)n;
    return TD_OK;
}

/* A tap's n values into *dst (host, cap floats, allocated on first use): from d32 (float) or,
 * when d16 is not NULL, from the 16-bit patterns of act dtype `act` (the values the engine
 * holds, converted exactly; this waits for the stream). */
static td_status tap_fetch(cu_engine *c, float **dst, size_t cap, const float *d32, const uint16_t *d16, size_t n,
                           td_err *err)
{
    cudaStream_t s = c->ws.s;
    td_status st = host_buf((void **)dst, cap * sizeof(float), err);
    if (st) return st;
    if (!d16) {
        TD_CU_TRY(err, cudaMemcpyAsync(*dst, d32, n * sizeof(float), cudaMemcpyDeviceToHost, s));
        return TD_OK;
    }
    /* the largest 16-bit intermediate: [C*k, H] expert outputs or [C*k, I/tp] activations */
    const size_t C = CU_TOKEN_CAP, H = (size_t)c->cfg.hidden_size, k = (size_t)c->cfg.num_experts_per_tok;
    const size_t il = (size_t)(c->cfg.moe_intermediate_size / c->base.variant.tp_size);
    const size_t cap16 = C * k * (H > il ? H : il);
    st = host_buf((void **)&c->h_16, cap16 * sizeof(uint16_t), err);
    if (st) return st;
    if (n > cap16) return td_err_set(err, TD_ERR_INTERNAL, "engine cuda: tap of %zu values", n);
    TD_CU_TRY(err, cudaMemcpyAsync(c->h_16, d16, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, s));
    TD_CU_TRY(err, cudaStreamSynchronize(s));
    const bool f16 = c->shape.act == 1;
    for (size_t i = 0; i < n; i++) (*dst)[i] = f16 ? td_f16_to_f32(c->h_16[i]) : td_bf16_to_f32(c->h_16[i]);
    return TD_OK;
}

/* One chunk of at most CU_TOKEN_CAP tokens: copy in, run, copy out, and the taps' data: the
 * routing's (ids, weights, logits) for every chunk at its tokens, the others when the whole
 * call is one chunk. */
static td_status run_chunk(cu_engine *c, const cu_layer *ly, const td_block_call *call, int64_t t0, int64_t Mc,
                           td_err *err)
{
    const td_config *cf = &c->cfg;
    const int64_t H = cf->hidden_size, E = cf->num_experts, k = cf->num_experts_per_tok;
    const int64_t L = call->layer;
    cudaStream_t s = c->ws.s;
    TD_CU_TRY(err, cudaMemcpyAsync(c->ws.x, call->input + t0 * H, (size_t)(Mc * H) * sizeof(float),
                                   cudaMemcpyHostToDevice, s));
    const bool routed = call->block == TD_BLOCK_MOE && call->route_ids;
    if (routed) {
        TD_CU_TRY(err, cudaMemcpyAsync(c->ws.ids, call->route_ids + t0 * k, (size_t)(Mc * k) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, s));
        TD_CU_TRY(err, cudaMemcpyAsync(c->ws.wts, call->route_weights + t0 * k, (size_t)(Mc * k) * sizeof(float),
                                       cudaMemcpyHostToDevice, s));
    }
    td_status st = run_work(c, L, ly, call->block, routed, Mc, err);
    if (st) return st;
    if (call->block == TD_BLOCK_ROUTER) {
        TD_CU_TRY(err, cudaMemcpy2DAsync(call->output + t0 * E, (size_t)E * sizeof(float), c->ws.logits,
                                         (size_t)c->ws.lg_ld * sizeof(float), (size_t)E * sizeof(float), (size_t)Mc,
                                         cudaMemcpyDeviceToHost, s));
        return TD_OK;
    }
    TD_CU_TRY(err, cudaMemcpyAsync(call->output + t0 * H, c->ws.out, (size_t)(Mc * H) * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    if (!c->base.taps) return TD_OK;
    const size_t C = CU_TOKEN_CAP, T = (size_t)c->base.variant.tp_size;
    const size_t il = (size_t)cf->moe_intermediate_size / T;
    st = route_bufs(c, call->n_tokens, err);
    if (st) return st;
    TD_CU_TRY(err, cudaMemcpyAsync(c->h_ids + t0 * k, c->ws.ids, (size_t)(Mc * k) * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, s));
    TD_CU_TRY(err, cudaMemcpyAsync(c->h_wts + t0 * k, c->ws.wts, (size_t)(Mc * k) * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    if (!routed && wants(c, L, "moe.router_logits"))
        TD_CU_TRY(err, cudaMemcpy2DAsync(c->h_logits + t0 * E, (size_t)E * sizeof(float), c->ws.logits,
                                         (size_t)c->ws.lg_ld * sizeof(float), (size_t)E * sizeof(float), (size_t)Mc,
                                         cudaMemcpyDeviceToHost, s));
    if (call->n_tokens > CU_TOKEN_CAP) return TD_OK; /* the per-slot and shared taps: one-chunk calls */
    if (c->base.variant.tp_rank != TD_TP_RANK_ALL) {
        /* the tensor-core path keeps these only as 16-bit patterns (cu_block_ws) */
        const bool mm = ly->w.mm, sh_mm = ly->w.sh_mm;
        if (wants(c, L, "moe.expert_act"))
            st = tap_fetch(c, &c->h_act, C * k * il, c->ws.act, mm ? c->ws.act16 : NULL, (size_t)Mc * k * il, err);
        if (!st && wants(c, L, "moe.expert_out"))
            st = tap_fetch(c, &c->h_eout, C * k * (size_t)H, c->ws.eout, mm ? c->ws.eout16 : NULL,
                           (size_t)(Mc * k * H), err);
        if (!st && ly->w.has_shared && wants(c, L, "moe.shared_out"))
            st = tap_fetch(c, &c->h_sh, C * (size_t)H, c->ws.sh_out, sh_mm ? c->ws.sh_out16 : NULL, (size_t)(Mc * H),
                           err);
        if (st) return st;
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
            cudaStreamSynchronize(c->ws.s);
            return td_err_prefix(err, "engine cuda: layer %lld: ", (long long)L);
        }
    }
    TD_CU_TRY(err, cudaStreamSynchronize(c->ws.s));
    if (!base->taps) return TD_OK;
    const int64_t H = c->cfg.hidden_size;
    if (call->block == TD_BLOCK_ROUTER) {
        const int64_t sh[2] = {M, E};
        return td_engine_put_tap(base, L, "moe.router_logits", TD_F32, 2, sh, call->output, err);
    }
    td_status st = TD_OK;
    const bool routed = call->route_ids != NULL;
    const int64_t sk[2] = {M, k};
    if (!routed && wants(c, L, "moe.router_logits")) {
        const int64_t sl[2] = {M, E};
        st = td_engine_put_tap(base, L, "moe.router_logits", TD_F32, 2, sl, c->h_logits, err);
    }
    if (!st) st = td_engine_put_tap(base, L, "moe.topk", TD_I32, 2, sk, c->h_ids, err);
    if (!st) st = td_engine_put_tap(base, L, "moe.topk_weights", TD_F32, 2, sk, c->h_wts, err);
    if (M <= CU_TOKEN_CAP) {
        if (!st && c->base.variant.tp_rank != TD_TP_RANK_ALL) {
            const int64_t il = c->cfg.moe_intermediate_size / c->base.variant.tp_size;
            const int64_t sa[3] = {M, k, il}, so[3] = {M, k, H}, ss[2] = {M, H};
            if (c->h_act && wants(c, L, "moe.expert_act"))
                st = td_engine_put_tap(base, L, "moe.expert_act", TD_F32, 3, sa, c->h_act, err);
            if (!st && c->h_eout && wants(c, L, "moe.expert_out"))
                st = td_engine_put_tap(base, L, "moe.expert_out", TD_F32, 3, so, c->h_eout, err);
            if (!st && ly->w.has_shared && c->h_sh && wants(c, L, "moe.shared_out"))
                st = td_engine_put_tap(base, L, "moe.shared_out", TD_F32, 2, ss, c->h_sh, err);
        }
    }
    const int64_t sh[2] = {M, H};
    if (!st) st = td_engine_put_tap(base, L, "moe.out", TD_F32, 2, sh, call->output, err);
    return st;
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
