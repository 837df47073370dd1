/* provenance.h — where a run came from: host, process, binary, environment, checkpoint.
 *
 * Contract
 * - td_prov_host_get() fills the identity of the calling process: host name, machine id
 *   (/etc/machine-id), boot id (/proc/sys/kernel/random/boot_id), CPU model and count, pid and
 *   the process start time (field 22 of /proc/PID/stat, clock ticks since boot). Facts that
 *   cannot be read are left empty ("") or -1; it never fails.
 * - td_prov_proc_start(pid) is the start time of a live process, or -1 when no such process
 *   exists or it is a zombie. A run's owner is alive iff it runs on the same host and boot and
 *   td_prov_proc_start(pid) equals the recorded start time (this survives pid reuse).
 * - td_prov_env_json() returns a new cJSON object with the environment variables that can
 *   change results: names starting with TANDEM_, TD_, CUDA_, NCCL_, OMP_, NVIDIA_, CUBLAS,
 *   CUDNN_ or equal to LD_LIBRARY_PATH / LD_PRELOAD. Values of names containing TOKEN, SECRET,
 *   PASSWORD or KEY are replaced by "<redacted>". Non-UTF-8 bytes become '?'.
 * - td_prov_uid() makes a random RFC 4122 version-4 UUID (getrandom, else /dev/urandom, else
 *   a SHA-256 of host, pid and time) as 36 lowercase characters.
 * - td_prov_checkpoint_fingerprint() hashes a checkpoint directory into 64 hex characters:
 *   SHA-256 over a domain tag, then the bytes of config.json (required), hf_quant_config.json
 *   and model.safetensors.index.json (when present), each preceded by "name size\n", then
 *   "name size\n" for every *.safetensors file in byte order of the name. With `full` the tag
 *   differs and each safetensors line also carries the file's own SHA-256, so every byte
 *   counts (slow on real checkpoints). Errors name the path.
 * - td_prov_now_iso() writes the current UTC time as "YYYY-MM-DDTHH:MM:SS.mmmZ"; these strings
 *   sort in time order.
 * - No function keeps state; all are thread-safe.
 */
#ifndef TD_PROVENANCE_H
#define TD_PROVENANCE_H

#include "td.h"

#include <stdbool.h>
#include <cjson/cJSON.h>

#define TD_PROV_TIME_LEN 24 /* "2026-09-05T12:34:56.789Z" */

typedef struct td_prov_host {
    char host[256];
    char machine_id[64];
    char boot_id[64];
    char cpu[256];
    int64_t pid;
    int64_t proc_start;
} td_prov_host;

void td_prov_host_get(td_prov_host *out);
int64_t td_prov_proc_start(int64_t pid);
bool td_prov_env_selected(const char *name);
cJSON *td_prov_env_json(void);
td_status td_prov_uid(char out[37], td_err *err);
td_status td_prov_checkpoint_fingerprint(const char *dir, bool full, char hex[65], td_err *err);
/* SHA-256 of the running executable (/proc/self/exe). */
td_status td_prov_self_sha256(char hex[65], td_err *err);
void td_prov_now_iso(char out[TD_PROV_TIME_LEN + 1]);
/* Format unix time (seconds, milliseconds) the same way. */
void td_prov_time_iso(int64_t sec, int ms, char out[TD_PROV_TIME_LEN + 1]);
/* Copy of `s` (malloc'd) with invalid UTF-8 bytes replaced by '?'; NULL on allocation failure. */
char *td_prov_utf8_clean(const char *s);

#endif /* TD_PROVENANCE_H */
