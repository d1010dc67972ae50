/*
 * ki_capture.h - capture windows: every kernel span of one GPU for N seconds (docs/wire.md,
 * "Capture windows in the ingest response").
 *
 * A collector asks in an ingest answer (KI-Capture: <id>;gpu=<n>;seconds=<s>); the agent
 * runs the window [now, now + s) on its own clock, ships every kernel span of that GPU
 * starting in it (ki_captures_covers is the drain loop's "capture until" hook: a record it
 * covers bypasses span sampling), and reports on the window in a CAPTURES section of every
 * batch sealed while it runs, the last one (final) sealed KI_CAPTURE_SETTLE_NS after its end.
 * Fixed-size state: nothing here allocates.
 */
#ifndef KI_CAPTURE_H
#define KI_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

#include "ki_wire.h"

struct ki_record;

#define KI_CAPTURE_MAX 16             /* windows running at once; more offers wait for the next answer */
#define KI_CAPTURE_OFFERS 4           /* KI-Capture values read from one answer */
#define KI_CAPTURE_RECENT 64          /* finished ids remembered, so a repeated offer is not run twice */
#define KI_CAPTURE_MAX_SECONDS 3600   /* an offer asking for longer is ignored */
#define KI_CAPTURE_SETTLE_NS 1000000000ULL /* the final report waits this long past the window's end */
/* Bytes a CAPTURES section takes at most: tag, length, count, and per window an 8-byte id,
 * four varints (gpu, start, end, spans) and the final byte. */
#define KI_CAPTURE_SECTION_MAX (1 + 2 + 1 + KI_CAPTURE_MAX * (8 + 3 + 10 + 10 + 10 + 1))

/* One KI-Capture value as the collector sent it. */
struct ki_capture_offer {
    uint64_t id;      /* the request id (16 hex digits) */
    uint32_t gpu;     /* GPU index */
    uint32_t seconds; /* window length */
};

/* One running window. */
struct ki_capture {
    uint64_t id;       /* request id, 0 when the slot is free */
    uint64_t start_ns; /* CLOCK_REALTIME, inclusive */
    uint64_t end_ns;   /* exclusive */
    uint64_t spans;    /* kernel spans of the GPU starting in the window, shipped so far */
    uint32_t gpu;      /* GPU index */
};

struct ki_captures {
    struct ki_capture w[KI_CAPTURE_MAX];
    uint64_t recent[KI_CAPTURE_RECENT]; /* ids of finished windows, a ring */
    unsigned nrecent;                   /* next slot of recent */
};

/* Parse one KI-Capture value "<16 lower-case hex>;gpu=<0..65535>;seconds=<1..3600>" of len
 * bytes: 0, or -EPROTO when it is not exactly that. Pure: exposed for the fuzz test. */
int ki_capture_parse(const char *v, size_t len, struct ki_capture_offer *out);

/* Start the window of an offer at now_ns: 1 started, 0 when that id runs or ran already,
 * -ENOSPC when KI_CAPTURE_MAX windows run. */
int ki_captures_start(struct ki_captures *c, const struct ki_capture_offer *o, uint64_t now_ns);

/* Whether a kernel span of gpu starting at ts_ns lies in a running window: the drain loop's
 * hook to ship it whatever its span sampling says. */
int ki_captures_covers(const struct ki_captures *c, uint32_t gpu, uint64_t ts_ns);

/* The latest end of gpu's running windows (0: none): "capture until" for that GPU. */
uint64_t ki_captures_until(const struct ki_captures *c, uint32_t gpu);

/* Windows running (0: the drain loop has nothing to do for captures). */
int ki_captures_running(const struct ki_captures *c);

/* Whether some window's final report is due at now_ns (seal a batch even without records). */
int ki_captures_due(const struct ki_captures *c, uint64_t now_ns);

/* Count the n records' kernel spans that running windows cover (call once per sealed batch,
 * with exactly the kernel records it ships). */
void ki_captures_count(struct ki_captures *c, const struct ki_record *recs, size_t n);

/* Write the CAPTURES section (tag, length, body) reporting on every running window at now_ns
 * into out (cap >= KI_CAPTURE_SECTION_MAX); windows whose final report this is are finished.
 * Returns the bytes written, 0 when no window runs. */
size_t ki_captures_section(struct ki_captures *c, uint64_t now_ns, uint8_t *out, size_t cap);

#endif /* KI_CAPTURE_H */
