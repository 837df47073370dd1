/* test_modview.c — core/modview: finding and checking one linear module of a checkpoint.
 *
 * Checkpoints come from tests/moe_fixture.h (NVFP4 experts in the ModelOpt and the
 * compressed-tensors convention, BF16 router and shared-expert gate). The views must point at
 * exactly the bytes the fixture wrote (compared element by element against the fixture's own
 * copies), carry the stored global and the right convention, and every mismatch between the
 * requested shape and the checkpoint must fail with TD_ERR_FORMAT naming the tensor.
 */
#include "test_common.h"
#include "moe_fixture.h"
#include "modview.h"
#include "quant.h"

typedef struct opened {
    td_st_set *set;
    td_quant q;
} opened;

static void open_dir(const char *dir, opened *o)
{
    td_err err;
    if (td_quant_load(dir, &o->q, &err)) fail_msg("%s", err.msg);
    if (td_st_set_open(dir, &o->set, &err)) fail_msg("%s", err.msg);
}

static void close_dir(opened *o)
{
    td_st_set_close(o->set);
    td_quant_free(&o->q);
}

static void check_format(mf_fmt fmt, const char *name)
{
    mf_opts mo;
    mf_defaults(&mo);
    mo.fmt = fmt;
    mo.seed = 41;
    mf_model m;
    mf_build(&mo, &m);
    const char *dir = td_test_path(name);
    mf_write(&m, dir);
    opened o;
    open_dir(dir, &o);
    const int64_t H = mo.hidden, I = mo.inter, E = mo.experts;
    td_err err;
    td_module_view v;
    for (int64_t e = 0; e < E; e++) {
        char mod[128];
        snprintf(mod, sizeof mod, "model.layers.0.mlp.experts.%lld.down_proj", (long long)e);
        const mf_linear *l = &m.layers[0].down[e];
        memset(&v, 0xA5, sizeof v); /* poisoned: every field must be written */
        assert_int_equal(td_module_view_get(o.set, &o.q, mod, H, I, &v, &err), TD_OK);
        assert_int_equal(v.rows, H);
        assert_int_equal(v.cols, I);
        if (fmt == MF_BF16) {
            assert_false(v.nvfp4);
            assert_int_equal(v.dtype, TD_BF16);
            assert_memory_equal(v.w, l->bf16, (size_t)(H * I) * 2);
            assert_null(v.scales);
        } else {
            assert_true(v.nvfp4);
            assert_int_equal(v.conv, fmt == MF_CT ? TD_NVFP4_CT : TD_NVFP4_MODELOPT);
            assert_memory_equal(v.w, l->packed, (size_t)(H * I / 2));
            assert_memory_equal(v.scales, l->scales, (size_t)(H * I / 16));
            assert_memory_equal(&v.global, &l->global, sizeof v.global);
        }
    }
    /* the router: dense BF16 [E, H] */
    assert_int_equal(td_module_view_get(o.set, &o.q, "model.layers.0.mlp.gate", E, H, &v, &err), TD_OK);
    assert_false(v.nvfp4);
    assert_int_equal(v.dtype, TD_BF16);
    assert_memory_equal(v.w, m.layers[0].router.bf16, (size_t)(E * H) * 2);
    /* wrong shapes, named */
    assert_int_equal(td_module_view_get(o.set, &o.q, "model.layers.0.mlp.gate", E + 1, H, &v, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "model.layers.0.mlp.gate.weight"));
    assert_non_null(strstr(err.msg, "expected ["));
    td_status st = td_module_view_get(o.set, &o.q, "model.layers.0.mlp.experts.0.down_proj", H, I + 16, &v, &err);
    assert_int_equal(st, TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "experts.0.down_proj.weight"));
    if (fmt != MF_BF16) {
        st = td_module_view_get(o.set, &o.q, "model.layers.0.mlp.experts.0.down_proj", H, I + 8, &v, &err);
        assert_int_equal(st, TD_ERR_FORMAT);
        assert_non_null(strstr(err.msg, "not a multiple of 16"));
    }
    /* a module that is not there */
    st = td_module_view_get(o.set, &o.q, "model.layers.0.mlp.experts.999.down_proj", H, I, &v, &err);
    assert_int_not_equal(st, TD_OK);
    assert_non_null(strstr(err.msg, "experts.999"));
    close_dir(&o);
    mf_free(&m);
}

static void modelopt_views(void **state)
{
    (void)state;
    check_format(MF_MODELOPT, "mv_mo");
}

static void compressed_tensors_views(void **state)
{
    (void)state;
    check_format(MF_CT, "mv_ct");
}

static void bf16_views(void **state)
{
    (void)state;
    check_format(MF_BF16, "mv_bf");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(modelopt_views),
        cmocka_unit_test(compressed_tensors_views),
        cmocka_unit_test(bf16_views),
    };
    return cmocka_run_group_tests_name("modview", tests, NULL, NULL);
}
