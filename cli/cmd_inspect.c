/* cmd_inspect.c — placeholder replaced below */
#include "cli.h"
#include <stdio.h>
int cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tandem inspect: not built yet\n"); return 2; }
