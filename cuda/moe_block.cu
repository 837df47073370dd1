/* moe_block.cu — the MoE block's launch sequence (see moe_block.cuh). */
#include "moe_block.cuh"

#include <stdio.h>
#include <string.h>

static void mm_groups(const cu_block_shape *sh, const cu_qmat *w13, const cu_qmat *w2, const cu_block_ws *ws,
                      cu_mm_call *m, bool grouped, int64_t tokens)
{
    const int64_t E = sh->E, nslots = tokens * sh->k;
    m->nslots = nslots;
    if (grouped) {
        m->pack = cu_mm_group_pack(nslots, tokens, w13, w2, sh->generic); /* as cut by cu_mm_group */
        m->n_groups = ws->n_groups;
        m->g_mat = ws->g_mat;
        m->g_start = ws->g_start;
        m->g_count = ws->g_count;
        m->perm = ws->perm;
        m->max_groups = cu_mm_group_grid(nslots, E, m->pack);
    } else {
        m->ids = ws->ids;
        m->pack = 1;
        m->max_groups = nslots;
    }
}

/* The calls of W13 + SwiGLU (m13) then W2 (m2) of one rank on the tensor-core path, both
 * written as 16-bit patterns only (act16, y16); mm_expert launches them. ids == NULL with
 * pack > 1: range groups over the tokens (shared expert).
 * x_nst > 0: ws->sp_x holds the input in k_wgp's layout of x_nst stages (cu_mm_round_split),
 * which the shared W13 takes when it runs on k_wgp with that layout. */
static void mm_expert_calls(const cu_block_shape *sh, const cu_block_ws *ws, const cu_qmat *w13, const cu_qmat *w2,
                            int ri, int64_t mats, bool routed_slots, bool grouped, int64_t Mc, int64_t il,
                            uint16_t *act16, uint16_t *y16, bool pdl, int x_nst, const uint32_t *xst,
                            int64_t xst_plane, cu_mm_call *m13, cu_mm_call *m2)
{
    const int64_t H = sh->H, k = sh->k;
    cu_mm_call m;
    memset(&m, 0, sizeof m);
    m.W = *w13;
    m.mats_per_expert = mats;
    m.mat_off = ri;
    if (routed_slots) {
        mm_groups(sh, w13, w2, ws, &m, grouped, Mc);
        m.in_div = k;
    } else {
        cu_mm_range_groups(&m, Mc);
        m.in_div = 1;
    }
    m.in16 = ws->xa16;
    m.in_ld = H;
    m.in_cols = H;
    m.out = NULL;
    m.out16 = act16;
    m.out_ld = il;
    m.out_n = il;
    m.epi = CU_MM_SWIGLU;
    m.act = sh->act;
    m.generic = sh->generic;
    m.dec_narrow = routed_slots && sh->dec_narrow;
    m.pdl = pdl ? 2 : 0;
    if (!routed_slots) {
        m.split_ws = ws->sp_sh;
        if (x_nst > 0 && cu_mm_wgp_stages(&m) == x_nst) { /* the round laid the input out */
            m.split_ws = ws->sp_x;
            m.presplit = 1;
        }
        m.xst = xst; /* the round staged the input (decode sizes) */
        m.xst_plane = xst_plane;
    }
    *m13 = m;
    m.xst = NULL; /* W2 reads W13's output */
    m.xst_plane = 0;
    m.W = *w2;
    m.in16 = act16;
    m.in_ld = il;
    m.in_div = 1;
    m.in_cols = il;
    m.out = NULL;
    m.out16 = y16;
    m.out_ld = H;
    m.out_n = H;
    m.epi = CU_MM_STORE;
    m.split_ws = routed_slots ? NULL : ws->sp_sh;
    m.presplit = 0;
    /* W2's routes and groups predate W13: its weights can load while W13 runs (the routed
     * experts' decode kernel; the shared expert's W2 waits first) */
    m.pdl = routed_slots ? 1 : 2;
    *m2 = m;
}

static td_status mm_expert(const cu_block_shape *sh, const cu_block_ws *ws, const cu_qmat *w13, const cu_qmat *w2,
                           int ri, int64_t mats, bool routed_slots, bool grouped, int64_t Mc, int64_t il,
                           uint16_t *act16, uint16_t *y16, bool pdl, int x_nst, const uint32_t *xst,
                           int64_t xst_plane, cudaStream_t s, td_err *err)
{
    cu_mm_call m13, m2;
    mm_expert_calls(sh, ws, w13, w2, ri, mats, routed_slots, grouped, Mc, il, act16, y16, pdl, x_nst, xst, xst_plane,
                    &m13, &m2);
    const td_status st = cu_mm(&m13, s, err);
    return st ? st : cu_mm(&m2, s, err);
}

/* The combine's inputs and output for W2 with the combine fused in (cu_mm_w2c). */
static cu_w2c_args w2c_args(const cu_block_shape *sh, const cu_block_w *ly, const cu_block_ws *c)
{
    cu_w2c_args cb;
    memset(&cb, 0, sizeof cb);
    cb.wts = c->wts;
    if (ly->has_shared) {
        cb.sgdot = c->logits + sh->E;
        cb.sg_ld = c->lg_ld;
        if (ly->sh_mm) cb.sh16 = c->sh_out16;
        else cb.sh32 = c->sh_out;
    }
    cb.out = c->out;
    cb.H = sh->H;
    cb.k = sh->k;
    return cb;
}

/* Whether the routed W2 call m2 of this block takes the combine fused in (one TP rank, direct
 * dispatch on the decode kernel, top-k <= W2C_MAX_K, where it is no slower: cu_mm_w2c_pays; not
 * with kernels=generic, whose k_mm and k_combine are the exact pair that checks it; not where
 * the bench asks for the separate combine). */
static bool w2c_fused(const cu_block_shape *sh, const cu_mm_call *m2)
{
    return sh->tp_rank >= 0 && !sh->separate_combine && cu_mm_w2c_pays(m2, sh->k);
}

/* Grouped dispatch: sort the call's slots by expert into packs (cu_mm_group) of the size the
 * routed experts' W13 and W2 take (cu_mm_group_pack; mm_groups passes the same to cu_mm). */
static td_status group_slots(const cu_block_shape *sh, const cu_block_w *ly, const cu_block_ws *c, int64_t Mc, bool pdl,
                             td_err *err)
{
    const int64_t n = Mc * sh->k;
    return cu_mm_group(c->ids, n, sh->E, cu_mm_group_pack(n, Mc, &ly->w13, &ly->w2, sh->generic), c->n_groups, c->g_mat,
                       c->g_start, c->g_count, c->perm, sh->generic, pdl, c->s, err);
}

/* Fork the shared expert of rank r onto s2 (after everything enqueued on s so far) and record
 * its end in ev_join. The join record is made even on failure, so that a capture can end once
 * s waits for it (shared_join). */
static td_status shared_fork(const cu_block_shape *sh, const cu_block_w *ly, const cu_block_ws *c, int r, int64_t Mc,
                             int x_nst, const uint32_t *xst, int64_t xst_plane, td_err *err)
{
    const int64_t H = sh->H, isl = sh->Is / sh->tp_size;
    const int ri = r - sh->rank0, act = sh->act;
    cudaStream_t s = c->s, s2 = c->s2;
    TD_CU_TRY(err, cudaEventRecord(c->ev_fork, s));
    TD_CU_TRY(err, cudaStreamWaitEvent(s2, c->ev_fork, 0));
    td_status st;
    if (ly->sh_mm) {
        st = mm_expert(sh, c, &ly->sh13, &ly->sh2, ri, 1, false, false, Mc, isl, c->sh_act16, c->sh_out16, false, x_nst,
                       xst, xst_plane, s2, err);
    } else {
        st = cu_moe_w13(ly->sh_gate, ly->sh_up, r * isl, isl, NULL, 1, Mc, c->xa, H, act, c->sh_act, s2, err);
        if (!st) st = cu_moe_w2(ly->sh_down, r * isl, isl, NULL, Mc, c->sh_act, H, act, c->sh_out, s2, err);
    }
    const cudaError_t ce = cudaEventRecord(c->ev_join, s2);
    if (!st && ce != cudaSuccess)
        st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: recording the shared expert's end: %s",
                        cudaGetErrorString(ce));
    return st;
}

/* s waits for the shared expert forked last; keeps the first error (st). */
static td_status shared_join(const cu_block_ws *c, td_status st, td_err *err)
{
    const cudaError_t ce = cudaStreamWaitEvent(c->s, c->ev_join, 0);
    if (!st && ce != cudaSuccess)
        st = td_err_set(err, TD_ERR_INTERNAL, "engine cuda: joining the shared-expert stream: %s",
                        cudaGetErrorString(ce));
    return st;
}

/* The routed experts of rank ri on the tensor-core path: W13 + SwiGLU, then W2, which takes the
 * combine (*fused) where w2c_fused says so, after the shared expert (*pending: forked and not
 * yet joined) whose output that combine reads is joined. */
static td_status routed_mm(const cu_block_shape *sh, const cu_block_w *ly, const cu_block_ws *c, int ri, bool grouped,
                           int64_t Mc, int64_t il, bool pdl, bool *pending, bool *fused, td_err *err)
{
    cu_mm_call m13, m2;
    mm_expert_calls(sh, c, &ly->w13, &ly->w2, ri, sh->nr, true, grouped, Mc, il, c->act16, c->eout16, pdl, 0, NULL, 0,
                    &m13, &m2);
    *fused = w2c_fused(sh, &m2);
    td_status st = cu_mm(&m13, c->s, err);
    if (!*fused) return st ? st : cu_mm(&m2, c->s, err);
    if (*pending) {
        st = shared_join(c, st, err);
        *pending = false;
    }
    if (st) return st;
    const cu_w2c_args cb = w2c_args(sh, ly, c);
    return cu_mm_w2c(&m2, &cb, c->s, err);
}

td_status cu_moe_block(const cu_block_shape *sh, const cu_block_w *ly, const cu_block_ws *c, cu_block_part part,
                       bool routed, int64_t Mc, td_err *err)
{
    const int64_t H = sh->H, E = sh->E, k = sh->k, lg = c->lg_ld;
    const int T = sh->tp_size, act = sh->act;
    const int64_t il = sh->I / T;
    cudaStream_t s = c->s;
    const bool mm_act = act == 1 || act == 2;
    td_status st = TD_OK;
    if (part == CU_BLOCK_ROUTED) {
        if (!ly->mm)
            return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda moe: the routed part alone runs on the tensor-core path only");
        if (sh->grouped) st = group_slots(sh, ly, c, Mc, false, err);
        bool pending = false, fused = false; /* W2 with its combine where the block has it */
        return st ? st : routed_mm(sh, ly, c, 0, sh->grouped, Mc, il, sh->grouped, &pending, &fused, err);
    }
    const bool all = sh->tp_rank < 0;
    const int r0 = all ? 0 : sh->tp_rank, r1 = all ? T : sh->tp_rank + 1;
    const bool shared = part == CU_BLOCK_MOE && ly->has_shared;
    const bool need_router = part == CU_BLOCK_ROUTER || !routed;
    /* the router (and the shared expert's gate, its last row) on the tensor-core path */
    const bool router_mm = ly->router_mm && (need_router || ly->has_shared);
    cu_mm_call rm;
    memset(&rm, 0, sizeof rm);
    int x_nst = 0; /* > 0: the round lays the input out for the router's k_wgp (and the shared W13's) */
    if (router_mm) {
        rm.W = ly->router_q;
        rm.mats_per_expert = 1;
        cu_mm_range_groups(&rm, Mc);
        rm.in16 = c->xa16;
        rm.in_ld = H;
        rm.in_div = 1;
        rm.in_cols = H;
        rm.out = c->logits;
        rm.out_ld = lg;
        rm.out_n = ly->router_q.rows;
        rm.epi = CU_MM_F32;
        rm.act = act;
        rm.generic = sh->generic;
        rm.pdl = 1; /* after the round, whose output it stages after its weight loads are issued */
        rm.split_ws = c->sp_x;
        if (c->sp_x && H % 16 == 0) x_nst = cu_mm_wgp_stages(&rm);
        rm.presplit = x_nst > 0;
    }
    /* the rounded input as floats (xa) is read by the CUDA-core kernels only */
    const bool need_xa = !mm_act || !ly->mm || !ly->router_mm || (ly->has_shared && !ly->sh_mm);
    /* decode sizes: the round stages the input once for the router's and the shared W13's k_mm
     * blocks, which copy it instead of each converting the same rows (cu_mm_call::xst) */
    uint32_t *xst = NULL;
    int64_t xst_plane = 0;
    if (x_nst == 0 && sh->stage_img && mm_act && c->sp_x && !sh->generic && Mc < 256 && H % 8 == 0 &&
        (router_mm || (shared && ly->sh_mm))) {
        xst = reinterpret_cast<uint32_t *>(c->sp_x);
        xst_plane = cu_mm_stage_plane(Mc, H);
        rm.xst = xst;
        rm.xst_plane = xst_plane;
    }
    if (x_nst > 0)
        st = cu_mm_round_split(c->x, need_xa ? c->xa : NULL, c->xa16, Mc, H, act, x_nst, c->sp_x, s, err);
    else if (xst)
        st = cu_mm_round_stage(c->x, need_xa ? c->xa : NULL, c->xa16, Mc, H, act, xst, s, err);
    else if (mm_act)
        st = cu_moe_round16(c->x, need_xa ? c->xa : NULL, c->xa16, Mc * H, act, s, err);
    else
        st = cu_moe_round(c->x, c->xa, Mc * H, act, s, err);
    if (st) return st;
    /* The first rank's shared expert needs only the rounded input: it runs beside the router,
     * the routing and the routed experts. */
    if (shared) {
        st = shared_fork(sh, ly, c, r0, Mc, x_nst, xst, xst_plane, err);
        if (st) return shared_join(c, st, err);
    }
    bool pending = shared; /* s has not waited for the forked shared expert yet */
    if (router_mm) {
        st = cu_mm(&rm, s, err);
    } else {
        if (need_router) st = cu_moe_linear(ly->router, 0, E, c->xa, H, Mc, c->logits, lg, s, err);
        if (!st && part == CU_BLOCK_MOE && ly->has_shared)
            st = cu_moe_linear(ly->sh_gw, 0, 1, c->xa, H, Mc, c->logits + E, lg, s, err);
    }
    if (st || part == CU_BLOCK_ROUTER) return pending ? shared_join(c, st, err) : st;
    /* from here on every launch on s follows a kernel: programmatic dependent launches */
    if (!routed)
        st = cu_moe_route(c->logits, lg, Mc, E, k, sh->renorm, c->ids, c->wts, sh->generic, true, s, err);
    else if (c->ids_discard)
        st = cu_moe_route(c->logits, lg, Mc, E, k, sh->renorm, c->ids_discard, c->wts_discard, sh->generic, true, s, err);
    const bool grouped = sh->grouped;
    if (!st && grouped) st = group_slots(sh, ly, c, Mc, true, err);
    for (int r = r0; r < r1 && !st; r++) {
        const int ri = r - sh->rank0;
        if (shared && r > r0) { /* the next rank's shared expert, after the previous combine */
            st = shared_fork(sh, ly, c, r, Mc, x_nst, xst, xst_plane, err);
            pending = true;
            if (st) break;
        }
        bool fused = false; /* W2 took the combine */
        if (ly->mm) {
            st = routed_mm(sh, ly, c, ri, grouped, Mc, il, true, &pending, &fused, err);
        } else {
            st = cu_moe_w13(ly->gate, ly->up, r * il, il, c->ids, k, Mc * k, c->xa, H, act, c->act, s, err);
            if (!st) st = cu_moe_w2(ly->down, r * il, il, c->ids, Mc * k, c->act, H, act, c->eout, s, err);
        }
        if (pending) {
            st = shared_join(c, st, err);
            pending = false;
        }
        if (!st && !fused)
            st = cu_moe_combine(c->wts, c->eout, ly->mm ? c->eout16 : NULL, k, ly->has_shared ? c->logits + E : NULL, lg,
                                c->sh_out, ly->sh_mm ? c->sh_out16 : NULL, Mc, H, act, r == r0 ? 0 : 1,
                                c->out, true, s, err);
    }
    if (pending) st = shared_join(c, st, err);
    if (!st && all) st = cu_moe_round(c->out, c->out, Mc * H, act, s, err);
    return st;
}

void cu_describe_device(td_engine_device *d)
{
    int dev = 0, v = 0;
    cudaDeviceProp prop;
    memset(d, 0, sizeof *d);
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        snprintf(d->gpu_name, sizeof d->gpu_name, "%s", prop.name);
    td_engine_read_driver_version(d->gpu_driver, sizeof d->gpu_driver);
    if (!d->gpu_driver[0] && cudaDriverGetVersion(&v) == cudaSuccess)
        snprintf(d->gpu_driver, sizeof d->gpu_driver, "CUDA driver API %d.%d", v / 1000, v % 1000 / 10);
    if (cudaRuntimeGetVersion(&v) == cudaSuccess)
        snprintf(d->cuda_version, sizeof d->cuda_version, "%d.%d", v / 1000, v % 1000 / 10);
}
