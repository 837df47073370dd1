/* cmd_inspect.c — `tandem inspect`: describe a checkpoint and report inconsistencies. */
#include "args.h"
#include "cli.h"
#include "inspect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem inspect --model DIR [--json] [--no-progress]\n"
            "\n"
            "Describe an HF checkpoint directory (qwen3_next or qwen4_exp): model family and key\n"
            "dimensions, layer types, the quantization map (modules, tensors and bytes per scheme),\n"
            "tensor count, total bytes and shards, and every inconsistency found: a missing tensor,\n"
            "a shape that contradicts config.json, a dtype that contradicts the quantization map,\n"
            "NaN or negative NVFP4 block-scale codes, global scales that are not finite and > 0, and\n"
            "tensors the config does not account for.\n"
            "\n"
            "options:\n"
            "  --model DIR     checkpoint directory (config.json + safetensors)\n"
            "  --json          print the report as JSON on stdout\n"
            "  --no-progress   never draw the progress bar (it is drawn only on a terminal)\n"
            "  -h, --help      this text\n"
            "\n"
            "exit status: 0 consistent (warnings allowed), 1 inconsistencies found,\n"
            "             2 usage error or a file that cannot be read or parsed.\n");
}

int cmd_inspect(int argc, char **argv)
{
    const char *model = NULL;
    bool json = false, progress = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--no-progress")) {
            progress = false;
        } else if (!strcmp(a, "--model")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tandem inspect: --model needs a directory\n");
                return 2;
            }
            model = argv[++i];
        } else if (!strncmp(a, "--model=", 8)) {
            model = a + 8;
        } else {
            fprintf(stderr, "tandem inspect: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "tandem inspect: --model DIR is required (see --help)\n");
        return 2;
    }
    td_inspect_report rep;
    td_err err;
    td_err_clear(&err);
    td_status st = td_inspect(model, progress, &rep, &err);
    if (st) {
        cli_error("inspect", err.msg);
        return 2;
    }
    if (json) {
        char *s = td_inspect_json(&rep);
        if (!s) {
            fprintf(stderr, "tandem inspect: out of memory\n");
            td_inspect_report_free(&rep);
            return 2;
        }
        printf("%s\n", s);
        free(s);
    } else {
        td_inspect_print(&rep, stdout);
    }
    int rc = rep.n_errors ? 1 : 0;
    td_inspect_report_free(&rep);
    return rc;
}
