/* progress.h — a one-line progress bar for long operations, drawn only on a terminal.
 *
 * Contract
 * - A td_progress is a plain value the caller owns (usually on the stack). The stream is
 *   borrowed: it must outlive the progress value and is never closed here. The label is
 *   copied (truncated to TD_PROGRESS_LABEL_MAX - 1 bytes), so the caller's string need not
 *   outlive init. Nothing here allocates or returns errors; write errors on the stream are
 *   ignored (progress output is advisory).
 * - Enabled or not is decided once, at init: force = -1 draws only when `stream` is a
 *   terminal (isatty), 0 never draws, 1 always draws (tests, or a caller that knows better).
 *   A NULL stream is always disabled. A disabled progress writes nothing at all, ever, and
 *   never reads the clock.
 * - Drawing: each redraw rewrites one line in place ("\r" ... padded with spaces over the
 *   previous line) as
 *       <label> [########............]  42% 420/1000 ETA 0:12
 *   ETA = elapsed * (total - done) / done, shown as M:SS or H:MM:SS ("--:--" while done is
 *   0). The percentage is rounded down and reaches 100 only when done >= total. When total
 *   is 0 (unknown), the line shows the count and the elapsed time instead.
 * - Rate limit: td_progress_update() draws on its first call and afterwards only when at
 *   least TD_PROGRESS_REDRAW_NS of clock time has passed since the last draw (at most 10
 *   redraws a second), so it is cheap to call on every item. td_progress_done() marks the
 *   work complete (done = total), always draws the final line ("... 100% 1000/1000 in
 *   0:05") and ends it with a newline; later update/done calls do nothing.
 * - Time comes from a clock callback returning nanoseconds from an arbitrary origin,
 *   non-decreasing; NULL selects td_progress_clock_monotonic(). Tests inject their own.
 * - Not thread-safe: one thread drives a given progress value. No global state.
 */
#ifndef TD_PROGRESS_H
#define TD_PROGRESS_H

#include "td.h"

#include <stdbool.h>
#include <stdio.h>

#define TD_PROGRESS_LABEL_MAX 32                     /* bytes, NUL included */
#define TD_PROGRESS_BAR_WIDTH 20                     /* cells; typical lines fit 80 columns */
#define TD_PROGRESS_REDRAW_NS UINT64_C(100000000)    /* 100 ms between redraws */

/* Clock callback: nanoseconds from an arbitrary origin, non-decreasing. */
typedef uint64_t (*td_progress_clock_fn)(void *clock_ctx);

typedef struct td_progress {
    FILE *stream;                       /* borrowed; NULL when disabled */
    char label[TD_PROGRESS_LABEL_MAX];  /* copy of the caller's label */
    uint64_t total;                     /* 0 = unknown */
    uint64_t done;                      /* last count passed to update */
    td_progress_clock_fn clock;         /* never NULL after init */
    void *clock_ctx;                    /* passed to clock */
    uint64_t start_ns;                  /* clock at init */
    uint64_t last_draw_ns;              /* clock at the last draw */
    size_t last_len;                    /* characters in the last line drawn */
    bool enabled;                       /* decided at init */
    bool drawn;                         /* a line has been drawn since init */
    bool finished;                      /* td_progress_done() has run */
} td_progress;

/* Auto mode (draw only on a terminal) with the monotonic clock. */
void td_progress_init(td_progress *p, FILE *stream, const char *label, uint64_t total);

/* force: -1 auto, 0 off, 1 on. clock NULL = td_progress_clock_monotonic. label NULL = "". */
void td_progress_init_ex(td_progress *p, FILE *stream, const char *label, uint64_t total,
                         int force, td_progress_clock_fn clock, void *clock_ctx);

/* Report that `done` items of `total` are complete; redraws at most every 100 ms. */
void td_progress_update(td_progress *p, uint64_t done);

/* Mark the work complete, draw the final line and end it with a newline. */
void td_progress_done(td_progress *p);

/* Whether this progress draws anything. */
bool td_progress_enabled(const td_progress *p);

/* CLOCK_MONOTONIC in nanoseconds (clock_ctx unused). */
uint64_t td_progress_clock_monotonic(void *clock_ctx);

#endif /* TD_PROGRESS_H */
