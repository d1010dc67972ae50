/* drain.c - ring consumer (ki_drain.h). */
#define _GNU_SOURCE /* MADV_DONTNEED */
#include "ki_ring.h"
#include "ki_drain.h"

#include <stdlib.h>
#include <sys/mman.h>

#define PAGE 4096u

struct ki_drain {
    struct ki_ring_consumer c; /* the attached consumer */
    uint64_t released;         /* ring position up to which pages were handed back */
};

struct ki_drain *ki_drain_create(const char *name, int create, uint64_t capacity, char *err, size_t errlen) {
    struct ki_drain *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (create) {
        struct ki_ring r;
        struct ki_ring_options opt = {capacity, 0600, (gid_t)-1, NULL};
        if (ki_ring_create(&r, name, &opt, 0, err, errlen) == 0) ki_ring_close(&r);
    }
    if (ki_ring_consumer_open(&d->c, name, 0, err, errlen) < 0) {
        free(d);
        return NULL;
    }
    d->released = KI_LOAD_ACQ(&d->c.ring.hdr->tail) / (PAGE / KI_RING_RECORD_SIZE) * (PAGE / KI_RING_RECORD_SIZE);
    return d;
}

void ki_drain_destroy(struct ki_drain *d) {
    if (!d) return;
    ki_ring_consumer_close(&d->c);
    free(d);
}

/* Drop the consumer's page mappings for whole pages of slots already consumed. */
static void release_pages(struct ki_drain *d) {
    const uint64_t per_page = PAGE / KI_RING_RECORD_SIZE;
    uint64_t tail = KI_LOAD_RLX(&d->c.ring.hdr->tail) / per_page * per_page;
    uint64_t cap = d->c.ring.mask + 1;
    if (tail - d->released < 4 * per_page) return; /* batch the syscalls */
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
    size_t n = ki_ring_consume(&d->c, out, max, ki_ring_mono_ns());
    release_pages(d);
    return n;
}

void ki_drain_stats(const struct ki_drain *d, struct ki_drain_stats *out) {
    const struct ki_ring_header *h = d->c.ring.hdr;
    out->dropped = KI_LOAD_RLX(&h->dropped);
    out->torn = KI_LOAD_RLX(&h->torn);
    out->abandoned = KI_LOAD_RLX(&h->abandoned);
    out->lost = KI_LOAD_RLX(&h->lost);
    uint64_t head = KI_LOAD_ACQ(&h->head), tail = KI_LOAD_ACQ(&h->tail);
    out->backlog = head > tail ? head - tail : 0;
}
