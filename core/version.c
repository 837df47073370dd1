/* version.c — compiled on every build with TD_VERSION/TD_COMMIT from the Makefile. */
#include "version.h"

#ifndef TD_VERSION
#define TD_VERSION "0.0.0"
#endif
#ifndef TD_COMMIT
#define TD_COMMIT "unknown"
#endif

const char *td_version(void) { return TD_VERSION; }
const char *td_commit(void) { return TD_COMMIT; }
