/* rowpar.c — row-parallel linear with the rank-ordered reduction (contract in rowpar.h). */
#include "rowpar.h"
#include "moe.h"

static void round_rows(float *y, int64_t ys, int64_t m, int64_t n, td_act_dtype act)
{
    if (act == TD_ACT_FP32) return;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) y[i * ys + j] = ref_round_act(y[i * ys + j], act);
}

/* Partial of rank r into dst (rounded). */
static td_status rank_partial(const ref_linear *l, const ref_numerics *nx, const ref_rowpar *rp, int r,
                              ref_pool *pool, ref_mm_ws *ws, const float *x, int64_t xs, int64_t m, float *dst,
                              int64_t ys, td_err *err)
{
    const int64_t cl = l->cols / rp->tp_size;
    ref_linear shard;
    td_status st = ref_linear_cols_slice(l, (int64_t)r * cl, cl, &shard, err);
    if (st) return td_err_prefix(err, "tp_size %d, rank %d: ", rp->tp_size, r);
    ref_mm(&shard, nx, pool, ws, x + (int64_t)r * cl, xs, m, dst, ys);
    round_rows(dst, ys, m, l->rows, rp->act);
    return TD_OK;
}

td_status ref_rowpar_check(const ref_linear *l, const ref_rowpar *rp, td_err *err)
{
    const int T = rp->tp_size;
    if (T < 1 || (rp->tp_rank != TD_TP_RANK_ALL && (rp->tp_rank < 0 || rp->tp_rank >= T)))
        return td_err_set(err, TD_ERR_ARG, "ref: tp_rank %d with tp_size %d", rp->tp_rank, T);
    if (l->cols % T)
        return td_err_set(err, TD_ERR_RANGE, "ref: tp_size %d does not divide the %lld input columns of the "
                          "output projection", T, (long long)l->cols);
    const int64_t cl = l->cols / T;
    for (int r = 0; r < T; r++) {
        ref_linear shard;
        td_status st = ref_linear_cols_slice(l, (int64_t)r * cl, cl, &shard, err);
        if (st) return td_err_prefix(err, "tp_size %d, rank %d: ", T, r);
    }
    return TD_OK;
}

td_status ref_mm_rowpar(const ref_linear *l, const ref_numerics *nx, const ref_rowpar *rp, ref_pool *pool,
                        ref_mm_ws *ws, const float *x, int64_t xs, int64_t m, float *y, int64_t ys,
                        float *partial, td_err *err)
{
    const int T = rp->tp_size;
    td_status st = ref_rowpar_check(l, rp, err);
    if (st) return st;
    if (rp->tp_rank != TD_TP_RANK_ALL) return rank_partial(l, nx, rp, rp->tp_rank, pool, ws, x, xs, m, y, ys, err);
    st = rank_partial(l, nx, rp, 0, pool, ws, x, xs, m, y, ys, err);
    if (st || T == 1) return st;
    TD_ASSERT(partial != NULL);
    for (int r = 1; r < T; r++) {
        st = rank_partial(l, nx, rp, r, pool, ws, x, xs, m, partial, ys, err);
        if (st) return st;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < l->rows; j++) y[i * ys + j] = y[i * ys + j] + partial[i * ys + j];
    }
    round_rows(y, ys, m, l->rows, rp->act);
    return TD_OK;
}
