/* drain.c - the agent's ring consumer: ki_ring_peek / ki_ring_commit plus restart skipping (ki_drain.h). */
#define _GNU_SOURCE /* MADV_DONTNEED */
#include "ki_ring.h"
#include "ki_drain.h"

#include <stdlib.h>
#include <sys/mman.h>

#define PAGE 4096u

struct ki_drain {
    struct ki_ring_consumer c; /* the attached consumer (ki_ring_peek / ki_ring_commit) */
    uint64_t skip_before;      /* positions below this were spooled by an earlier run */
    uint64_t skipped;          /* records skipped for that reason */
    uint64_t released;         /* ring position up to which pages were handed back */
    int keep;                  /* pages read stay mapped (ki_drain_keep_pages) */
};

struct ki_drain *ki_drain_create(const char *name, int create, uint64_t capacity, int *rc, char *err, size_t errlen) {
    struct ki_drain *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory");
        *rc = -ENOMEM;
        return NULL;
    }
    if (create) {
        struct ki_ring r;
        struct ki_ring_options opt = {capacity, 0600, (gid_t)-1, NULL};
        if (ki_ring_create(&r, name, &opt, 0, err, errlen) == 0) ki_ring_close(&r);
    }
    if ((*rc = ki_ring_consumer_open(&d->c, name, 0, err, errlen)) < 0) {
        free(d);
        return NULL;
    }
    d->released = d->c.read_pos / (PAGE / KI_RING_RECORD_SIZE) * (PAGE / KI_RING_RECORD_SIZE);
    return d;
}

void ki_drain_destroy(struct ki_drain *d) {
    if (!d) return;
    ki_ring_consumer_close(&d->c);
    free(d);
}

void ki_drain_skip_before(struct ki_drain *d, uint64_t ring_created_ns, uint64_t pos) {
    if (d && ring_created_ns == d->c.ring.hdr->created_ns) d->skip_before = pos;
}

uint64_t ki_drain_ring_created_ns(const struct ki_drain *d) { return d ? d->c.ring.hdr->created_ns : 0; }
uint64_t ki_drain_read_pos(const struct ki_drain *d) { return d ? d->c.read_pos : 0; }
uint64_t ki_drain_skipped(const struct ki_drain *d) { return d ? d->skipped : 0; }

/* Drop the consumer's page mappings for whole pages of slots already freed. */
static void release_pages(struct ki_drain *d) {
    const uint64_t per_page = PAGE / KI_RING_RECORD_SIZE;
    uint64_t tail = KI_LOAD_RLX(&d->c.ring.hdr->tail) / per_page * per_page;
    uint64_t cap = d->c.ring.mask + 1;
    if (d->keep) {
        d->released = tail; /* (nothing to hand back when keeping ends but what it maps then) */
        return;
    }
    if (cap < per_page || tail - d->released < 4 * per_page) return; /* batch the syscalls */
    if (tail - d->released >= cap) d->released = tail - cap;
    while (d->released < tail) {
        uint64_t idx = d->released & d->c.ring.mask;
        uint64_t n = tail - d->released;
        if (idx + n > cap) n = cap - idx;
        madvise((char *)&d->c.ring.slots[idx], (size_t)(n * KI_RING_RECORD_SIZE), MADV_DONTNEED);
        d->released += n;
    }
}

size_t ki_drain_poll(struct ki_drain *d, struct ki_record *out, size_t max) {
    if (!d) return 0;
    for (;;) {
        size_t got = ki_ring_peek(&d->c, out, max, ki_ring_mono_ns());
        if (!got || out[0].pos >= d->skip_before) return got; /* positions increase: only a prefix can need skipping */
        /* Drop what an earlier run already spooled (only right after a restart). */
        size_t kept = 0;
        for (size_t i = 0; i < got; i++) {
            if (out[i].pos < d->skip_before) d->skipped++;
            else out[kept++] = out[i];
        }
        if (kept || got < max) return kept;
    }
}

size_t ki_drain_poll_keep(struct ki_drain *d, struct ki_record *out, size_t max,
                          size_t (*keep)(void *arg, struct ki_record *recs, size_t n), void *arg, size_t *read) {
    *read = 0;
    if (!d) return 0;
    if (d->c.read_pos >= d->skip_before)
        return ki_ring_consume_keep(&d->c, out, max, ki_ring_mono_ns(), keep, arg, read);
    /* Right after a restart: what an earlier run spooled is dropped before keep sees it. */
    size_t got = ki_drain_poll(d, out, max);
    *read = got;
    return got ? keep(arg, out, got) : 0;
}

void ki_drain_keep_pages(struct ki_drain *d, int keep) {
    if (!d || d->keep == !!keep) return;
    d->keep = !!keep;
    if (keep) return;
    /* Every page of the slots may be mapped by now (read in earlier laps, or mapped around a
     * fault): hand them all back; those still to be read come back as they are read. */
    uint64_t cap = d->c.ring.mask + 1;
    madvise((char *)d->c.ring.slots, (size_t)(cap * KI_RING_RECORD_SIZE), MADV_DONTNEED);
}

void ki_drain_commit(struct ki_drain *d) {
    if (!d) return;
    ki_ring_commit(&d->c);
    release_pages(d);
}

void ki_drain_stats(const struct ki_drain *d, struct ki_drain_stats *out) {
    memset(out, 0, sizeof *out);
    if (!d) return;
    const struct ki_ring_header *h = d->c.ring.hdr;
    out->dropped = KI_LOAD_RLX(&h->dropped);
    out->torn = KI_LOAD_RLX(&h->torn);
    out->abandoned = KI_LOAD_RLX(&h->abandoned);
    out->lost = KI_LOAD_RLX(&h->lost);
    out->cupti_dropped = KI_LOAD_RLX(&h->cupti_dropped);
    out->cupti_refused = KI_LOAD_RLX(&h->cupti_refused);
    uint64_t head = KI_LOAD_ACQ(&h->head), tail = KI_LOAD_ACQ(&h->tail);
    out->backlog = head > tail ? head - tail : 0;
    out->capacity = d->c.ring.mask + 1;
}
