/* main.c — the `tandem` command: dispatch to subcommand front ends (cli/cmd_*.c).
 *
 * Each subcommand is `int cmd_NAME(int argc, char **argv)` (argv[0] is the subcommand name)
 * returning the process exit status: 0 success, 1 a check found a problem, 2 usage or input
 * error. Front ends parse options and call library code; they hold no logic of their own.
 */
#include "cli.h"
#include "version.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"gen", cmd_gen, "write a synthetic checkpoint in the real format (presets)"},
    {"quantize", cmd_quantize, "quantize a BF16/F16/F32 checkpoint to NVFP4"},
    {"inspect", cmd_inspect, "describe a checkpoint and report inconsistencies"},
    {"db", cmd_db, "query and maintain the results store"},
    {"run", cmd_run, "greedy generation with engine variants: completion hashes, divergences, margins"},
    {"audit", cmd_audit, "audits: e4m3 (codecs and raw-vs-prepared scale storage), layer (MoE block)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tandem <command> [options]\n\n"
               "tandem runs a scalar CPU reference engine and an optimized CUDA engine on the same\n"
               "NVFP4 checkpoint, compares them and stores every result.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'tandem <command> --help' describes a command; 'tandem --version' prints the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tandem %s (commit %s)\n", td_version(), td_commit());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
