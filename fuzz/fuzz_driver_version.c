/* fuzz_driver_version.c — libFuzzer target for the NVIDIA driver version parser
 * (td_engine_driver_version, the text of /proc/driver/nvidia/version).
 *
 * The input is the file's text (not NUL-terminated); it is parsed with several output
 * capacities. A result must be NUL-terminated inside its buffer and made of digits and dots
 * only. Any crash or sanitizer report is a bug.
 */
#include "engine.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const size_t caps[] = {1, 2, 8, 11, 64};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        char *out = malloc(caps[c]);
        if (!out) return 0;
        td_engine_driver_version((const char *)data, size, out, caps[c]);
        const char *end = memchr(out, '\0', caps[c]);
        if (!end) abort();
        for (const char *p = out; p < end; p++)
            if ((*p < '0' || *p > '9') && *p != '.') abort();
        free(out);
    }
    return 0;
}
