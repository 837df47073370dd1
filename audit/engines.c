/* engines.c — binds engine names to the implementations in this binary (see engines.h). */
#include "engines.h"
#include "db/db.h"
#include "ref/engine_ref.h"

#include <string.h>

#ifdef TD_HAVE_CUDA
extern const td_engine_ops td_cuda_engine_ops; /* cuda/ (built by make gpu) */
#endif

const td_engine_ops *td_engine_impl(const char *name, const char **why)
{
    const char *w = "unknown engine";
    const td_engine_ops *ops = NULL;
    if (name && !strcmp(name, "ref")) {
        ops = &td_ref_engine_ops;
    } else if (name && !strcmp(name, "cuda")) {
#ifdef TD_HAVE_CUDA
        ops = &td_cuda_engine_ops;
#else
        w = "this build has no CUDA engine (it needs nvcc and the CUDA engine sources: make gpu)";
#endif
    }
    if (why) *why = ops ? NULL : w;
    return ops;
}

td_status td_engine_load(const char *checkpoint, const td_variant *v, td_engine **out, td_err *err)
{
    TD_ASSERT(out && v);
    *out = NULL;
    const td_engine_entry *en = td_engine_find(v->engine);
    char text[TD_VARIANT_TEXT_MAX];
    td_variant_format(v, text, sizeof text);
    if (!en) return td_err_set(err, TD_ERR_ARG, "variant '%s': unknown engine '%s'", text, v->engine);
    const char *why = NULL;
    const td_engine_ops *ops = td_engine_impl(en->name, &why);
    if (!ops) return td_err_set(err, TD_ERR_UNSUPPORTED, "engine '%s' is not built: %s", en->name, why);
    if (v->set & ~en->options)
        return td_err_set(err, TD_ERR_ARG, "variant '%s': an option is not supported by engine '%s'", text,
                          en->name);
    if (!checkpoint || !*checkpoint)
        return td_err_set(err, TD_ERR_ARG, "engine '%s': no checkpoint directory given", en->name);
    td_variant r = *v;
    td_variant_resolve(&r);
    td_status st = ops->load(checkpoint, &r, out, err);
    if (st) {
        *out = NULL;
        return st;
    }
    (*out)->ops = ops;
    (*out)->variant = r;
    return TD_OK;
}

td_status td_engine_device_record(struct td_db *db, int64_t run, const td_engine_device *d, td_err *err)
{
    if (!db || !d || !d->gpu_name[0]) return TD_OK;
    td_db_device dev;
    memset(&dev, 0, sizeof dev);
    dev.gpu_name = d->gpu_name;
    dev.gpu_driver = d->gpu_driver[0] ? d->gpu_driver : NULL;
    dev.cuda_version = d->cuda_version[0] ? d->cuda_version : NULL;
    return td_db_run_set_device(db, run, &dev, err);
}
