/* drain.c - two-phase ring consumer (ki_drain.h). */
#define _GNU_SOURCE /* MADV_DONTNEED */
#include "ki_ring.h"
#include "ki_drain.h"

#include <stdlib.h>
#include <sys/mman.h>

#define PAGE 4096u

struct ki_drain {
    struct ki_ring_consumer c; /* the attached consumer */
    uint64_t read_pos;         /* next position to read; slots from tail to here are read, not yet freed */
    uint64_t pending;          /* records handed out since the last commit */
    uint64_t skip_before;      /* positions below this were spooled by an earlier run */
    uint64_t skipped;          /* records skipped for that reason */
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
    d->read_pos = KI_LOAD_ACQ(&d->c.ring.hdr->tail);
    d->released = d->read_pos / (PAGE / KI_RING_RECORD_SIZE) * (PAGE / KI_RING_RECORD_SIZE);
    return d;
}

void ki_drain_destroy(struct ki_drain *d) {
    if (!d) return;
    ki_ring_consumer_close(&d->c);
    free(d);
}

void ki_drain_skip_before(struct ki_drain *d, uint64_t ring_created_ns, uint64_t pos) {
    if (ring_created_ns == d->c.ring.hdr->created_ns) d->skip_before = pos;
}

uint64_t ki_drain_ring_created_ns(const struct ki_drain *d) { return d->c.ring.hdr->created_ns; }
uint64_t ki_drain_read_pos(const struct ki_drain *d) { return d->read_pos; }
uint64_t ki_drain_skipped(const struct ki_drain *d) { return d->skipped; }

/* Drop the consumer's page mappings for whole pages of slots already freed. */
static void release_pages(struct ki_drain *d) {
    const uint64_t per_page = PAGE / KI_RING_RECORD_SIZE;
    uint64_t tail = KI_LOAD_RLX(&d->c.ring.hdr->tail) / per_page * per_page;
    uint64_t cap = d->c.ring.mask + 1;
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
    struct ki_ring_consumer *c = &d->c;
    struct ki_ring *r = &c->ring;
    struct ki_ring_header *h = r->hdr;
    const uint64_t cap = r->mask + 1;
    const uint64_t now_ns = ki_ring_mono_ns();
    uint64_t pos = d->read_pos;
    size_t n = 0;
    while (n < max) {
        struct ki_slot *s = &r->slots[pos & r->mask];
        uint64_t seq = KI_LOAD_ACQ(&s->seq);
        if (seq == pos + 1) {
            struct ki_record *o = &out[n];
            o->pos = pos;
            o->producer = s->producer;
            o->check = s->check;
            memcpy(&o->rec, &s->rec, sizeof o->rec);
            pos++;
            if (ki_ring_checksum(o->pos, o->producer, &o->rec) != o->check) {
                KI_ADD_RLX(&h->torn, 1);
                c->torn++;
                continue;
            }
            if (o->pos < d->skip_before) {
                d->skipped++;
                continue;
            }
            n++;
        } else if (seq - pos >= cap && seq - pos <= 2 * cap) {
            pos++; /* freed by a consumer that died before advancing tail (and maybe reused) */
        } else if (seq == pos && KI_LOAD_ACQ(&h->head) > pos) {
            /* reserved, not yet published: the ring's stall rules */
            if (c->stall_pos != pos) {
                c->stall_pos = pos;
                c->stall_since_ns = now_ns;
                break;
            }
            uint64_t waited = now_ns - c->stall_since_ns;
            int dead = 0;
            if (waited >= c->stall_min_ns) {
                uint32_t pid = KI_LOAD_ACQ(&r->producers[KI_LOAD_RLX(&s->producer) & (KI_RING_MAX_PRODUCERS - 1)].pid);
                dead = !ki_ring__pid_alive(pid);
            }
            if (!dead && waited < c->stall_timeout_ns) break;
            uint64_t expect = pos;
            if (__atomic_compare_exchange_n(&s->seq, &expect, pos + cap, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                KI_ADD_RLX(&h->abandoned, 1);
                c->abandoned++;
                pos++;
            }
        } else if (seq == pos) {
            break; /* empty */
        } else {
            KI_ADD_RLX(&h->torn, 1); /* a sequence no protocol step produces: resynchronise */
            c->torn++;
            KI_STORE_REL(&s->seq, pos + cap);
            pos++;
        }
    }
    d->read_pos = pos;
    d->pending += n;
    return n;
}

void ki_drain_commit(struct ki_drain *d) {
    struct ki_ring *r = &d->c.ring;
    struct ki_ring_header *h = r->hdr;
    const uint64_t cap = r->mask + 1;
    uint64_t tail = KI_LOAD_RLX(&h->tail);
    if (tail == d->read_pos) return;
    for (uint64_t p = tail; p < d->read_pos; p++) {
        struct ki_slot *s = &r->slots[p & r->mask];
        if (KI_LOAD_ACQ(&s->seq) == p + 1) {
            /* Clear the writer id so a later stall of this slot never blames a stale writer (as ki_ring.h does). */
            __atomic_store_n(&s->producer, 0, __ATOMIC_RELAXED);
            KI_STORE_REL(&s->seq, p + cap);
        }
    }
    KI_STORE_REL(&h->tail, d->read_pos);
    KI_ADD_RLX(&h->consumed, d->pending);
    d->pending = 0;
    release_pages(d);
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
