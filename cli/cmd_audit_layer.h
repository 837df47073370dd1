/* cmd_audit_layer.h — `tandem audit layer` (the per-layer MoE audit, audit/layer_audit.h).
 *
 * Contract: as every subcommand (cli.h): argv[0] = "layer"; returns the exit status
 * 0 every expectation met, 1 an expectation failed, 2 usage or input error. Called by the
 * `tandem audit` dispatcher.
 */
#ifndef TD_CMD_AUDIT_LAYER_H
#define TD_CMD_AUDIT_LAYER_H

int cmd_audit_layer(int argc, char **argv);

#endif
