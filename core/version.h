/* version.h — tandem's version and the git commit it was built from.
 *
 * Contract: both strings are static and never NULL; the commit is "unknown" outside a git
 * checkout and ends in "-dirty" when built from a modified tree.
 */
#ifndef TD_VERSION_H
#define TD_VERSION_H

const char *td_version(void);
const char *td_commit(void);

#endif
