/* progress.c — terminal progress bar with rate-limited redraws (see progress.h). */
#include "progress.h"

#include <inttypes.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Longest ETA shown; anything longer is displayed as this (99:59:59). */
#define PROGRESS_MAX_SECONDS UINT64_C(359999)

uint64_t td_progress_clock_monotonic(void *clock_ctx)
{
    (void)clock_ctx;
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

void td_progress_init(td_progress *p, FILE *stream, const char *label, uint64_t total)
{
    td_progress_init_ex(p, stream, label, total, -1, NULL, NULL);
}

void td_progress_init_ex(td_progress *p, FILE *stream, const char *label, uint64_t total,
                         int force, td_progress_clock_fn clock, void *clock_ctx)
{
    TD_ASSERT(p != NULL);
    TD_ASSERT(force >= -1 && force <= 1);
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total = total;
    p->clock = clock ? clock : td_progress_clock_monotonic;
    p->clock_ctx = clock_ctx;
    if (stream == NULL || force == 0) p->enabled = false;
    else if (force == 1) p->enabled = true;
    else {
        int fd = fileno(stream);
        p->enabled = fd >= 0 && isatty(fd) == 1;
    }
    p->stream = p->enabled ? stream : NULL;
    if (p->enabled) p->start_ns = p->last_draw_ns = p->clock(p->clock_ctx);
}

bool td_progress_enabled(const td_progress *p)
{
    TD_ASSERT(p != NULL);
    return p->enabled;
}

/* ---- formatting ---------------------------------------------------------------------- */

/* Seconds as M:SS below an hour, H:MM:SS above (capped at 99:59:59). */
static void format_duration(char *buf, size_t cap, uint64_t seconds)
{
    if (seconds > PROGRESS_MAX_SECONDS) seconds = PROGRESS_MAX_SECONDS;
    unsigned h = (unsigned)(seconds / 3600), m = (unsigned)(seconds / 60 % 60),
             s = (unsigned)(seconds % 60);
    if (h > 0) snprintf(buf, cap, "%u:%02u:%02u", h, m, s);
    else snprintf(buf, cap, "%u:%02u", m, s);
}

/* Whole seconds in a nanosecond interval, rounded to nearest. */
static uint64_t ns_to_seconds(double ns)
{
    double s = ns / 1e9 + 0.5;
    return s >= (double)PROGRESS_MAX_SECONDS ? PROGRESS_MAX_SECONDS : (uint64_t)s;
}

/* floor(100 * done / total) without overflow; 100 only when done >= total (total > 0). */
static unsigned progress_percent(uint64_t done, uint64_t total)
{
    if (done >= total) return 100;
    uint64_t pct = done <= UINT64_MAX / 100 ? done * 100 / total : done / (total / 100);
    return pct > 99 ? 99u : (unsigned)pct;
}

/* Filled cells of the bar; full only when done >= total. */
static unsigned progress_cells(uint64_t done, uint64_t total)
{
    if (done >= total) return TD_PROGRESS_BAR_WIDTH;
    unsigned cells = (unsigned)((double)done / (double)total * TD_PROGRESS_BAR_WIDTH);
    return cells >= TD_PROGRESS_BAR_WIDTH ? TD_PROGRESS_BAR_WIDTH - 1 : cells;
}

/* Write the current line (and a newline when final) and remember when. */
static void progress_draw(td_progress *p, uint64_t now, bool final)
{
    char line[256];   /* label (31) + bar (22) + counts (2 x 20) + ETA: well under 256 */
    char when[32];
    uint64_t elapsed_ns = now >= p->start_ns ? now - p->start_ns : 0;
    int len;

    if (p->total == 0) {
        format_duration(when, sizeof when, ns_to_seconds((double)elapsed_ns));
        len = snprintf(line, sizeof line, "%s %" PRIu64 " %s %s", p->label, p->done,
                       final ? "in" : "elapsed", when);
    } else {
        char bar[TD_PROGRESS_BAR_WIDTH + 1];
        unsigned cells = progress_cells(p->done, p->total);
        for (unsigned i = 0; i < TD_PROGRESS_BAR_WIDTH; i++) bar[i] = i < cells ? '#' : '.';
        bar[TD_PROGRESS_BAR_WIDTH] = '\0';
        if (final) {
            format_duration(when, sizeof when, ns_to_seconds((double)elapsed_ns));
        } else if (p->done == 0) {
            snprintf(when, sizeof when, "--:--");
        } else {
            uint64_t left = p->done >= p->total ? 0 : p->total - p->done;
            double eta_ns = (double)elapsed_ns * (double)left / (double)p->done;
            format_duration(when, sizeof when, ns_to_seconds(eta_ns));
        }
        len = snprintf(line, sizeof line, "%s [%s] %3u%% %" PRIu64 "/%" PRIu64 " %s %s",
                       p->label, bar, progress_percent(p->done, p->total), p->done, p->total,
                       final ? "in" : "ETA", when);
    }
    if (len < 0) return;
    size_t n = (size_t)len < sizeof line ? (size_t)len : sizeof line - 1;

    fputc('\r', p->stream);
    fwrite(line, 1, n, p->stream);
    /* Blank what is left of a longer previous line. */
    for (size_t i = n; i < p->last_len; i++) fputc(' ', p->stream);
    if (final) fputc('\n', p->stream);
    fflush(p->stream);

    p->last_len = n;
    p->last_draw_ns = now;
    p->drawn = true;
}

/* ---- updates ------------------------------------------------------------------------- */

void td_progress_update(td_progress *p, uint64_t done)
{
    TD_ASSERT(p != NULL);
    if (!p->enabled || p->finished) return;
    p->done = done;
    uint64_t now = p->clock(p->clock_ctx);
    if (p->drawn && (now < p->last_draw_ns || now - p->last_draw_ns < TD_PROGRESS_REDRAW_NS))
        return;
    progress_draw(p, now, false);
}

void td_progress_done(td_progress *p)
{
    TD_ASSERT(p != NULL);
    if (!p->enabled || p->finished) return;
    if (p->total > 0) p->done = p->total;
    progress_draw(p, p->clock(p->clock_ctx), true);
    p->finished = true;
}
