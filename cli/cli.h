/* cli.h — subcommand entry points of the `tandem` CLI (one cli/cmd_*.c file each).
 *
 * Contract: `int cmd_X(int argc, char **argv)` with argv[0] = "X"; returns the exit status:
 * 0 ok, 1 a check found a problem (inconsistency, regression), 2 usage or input error.
 * Errors go to stderr prefixed "tandem X: "; results to stdout (human text, or JSON with
 * --json).
 */
#ifndef TD_CLI_H
#define TD_CLI_H

int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_db(int argc, char **argv);
int cmd_audit(int argc, char **argv);
int cmd_run(int argc, char **argv);

#endif
