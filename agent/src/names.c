/* names.c - STRING chunk reassembly (ki_names.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_names.h"
#include "ki_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "ki_ring.h"
#include "ki_varint.h"

enum { SLOT_EMPTY = 0, SLOT_PARTIAL = 1, SLOT_COMPLETE = 2, SLOT_BROKEN = 3 };

struct ki_name {
    uint32_t producer; /* writer's producer id */
    uint32_t id;       /* the producer's string id */
    uint32_t off;      /* text offset in the arena */
    uint32_t len;      /* text bytes kept */
    uint32_t mark;     /* batch mark of the last use */
    uint16_t next;     /* next expected chunk index */
    uint8_t state : 2; /* SLOT_* */
    uint8_t cut : 1;   /* text was cut to name_max */
    uint8_t sent;      /* text went into a batch in this generation (ki_names.sent_gen); 0: not since */
};
/* Names once took the spare byte: the records (10,000 names: 240 KiB) did not grow. */
_Static_assert(sizeof(struct ki_name) == 24, "struct ki_name grew");

/* Names in a dense array in arrival order, found through an open-addressing index of 4-byte
 * entries: with 10,000 names in a table sized for 16,384 the index (128 KiB) is all touched, but
 * the 24-byte records only as far as names arrive (a table of records was 768 KiB, all touched). */
struct ki_names {
    uint32_t *index;       /* open addressing, power-of-two size: record + 1, 0 = empty */
    struct ki_name *slots; /* limit records, the first used in use */
    size_t mask;           /* index slots - 1 */
    size_t used;           /* records in use */
    size_t limit;          /* most records before a reset */
    char *arena;           /* name text */
    size_t arena_cap;      /* arena bytes */
    size_t arena_used;     /* arena bytes used */
    size_t name_max;       /* longest name kept */
    uint64_t resets;       /* times cleared */
    uint64_t truncated;    /* names cut */
    int dirty;             /* a name completed since the last save */
    uint8_t sent_gen;      /* generation of ki_name.sent, 1..255: ki_names_forget moves it on */
};

struct ki_names *ki_names_create(size_t max_names, size_t arena_bytes, size_t name_max) {
    struct ki_names *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    size_t size = 16;
    while (size < max_names + max_names / 3) size <<= 1;
    n->index = calloc(size, sizeof *n->index);
    n->slots = malloc(max_names * sizeof *n->slots);
    n->arena = malloc(arena_bytes);
    if (!n->index || !n->slots || !n->arena) {
        ki_names_destroy(n);
        return NULL;
    }
    n->mask = size - 1;
    n->limit = max_names;
    n->arena_cap = arena_bytes;
    n->name_max = name_max < arena_bytes ? name_max : arena_bytes;
    n->sent_gen = 1;
    return n;
}

void ki_names_destroy(struct ki_names *n) {
    if (!n) return;
    free(n->index);
    free(n->slots);
    free(n->arena);
    free(n);
}

static void reset(struct ki_names *n) {
    memset(n->index, 0, (n->mask + 1) * sizeof *n->index);
    n->used = 0;
    n->arena_used = 0;
    n->resets++;
}

static size_t hash(uint32_t producer, uint32_t id) {
    uint64_t h = ((uint64_t)producer << 32 | id) * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 32);
}

/* The name's record, or NULL with *pos its empty index slot. */
static struct ki_name *lookup(const struct ki_names *n, uint32_t producer, uint32_t id, size_t *pos) {
    for (size_t i = hash(producer, id) & n->mask;; i = (i + 1) & n->mask) {
        uint32_t e = n->index[i];
        if (e == 0) {
            *pos = i;
            return NULL;
        }
        struct ki_name *s = &n->slots[e - 1];
        if (s->producer == producer && s->id == id) return s;
    }
}

static const struct ki_name *find(const struct ki_names *n, uint32_t producer, uint32_t id) {
    size_t pos;
    return lookup(n, producer, id, &pos);
}

/* A new record at index slot pos (used < limit). */
static struct ki_name *insert(struct ki_names *n, size_t pos) {
    n->index[pos] = (uint32_t)(n->used + 1);
    return &n->slots[n->used++];
}

void ki_names_add(struct ki_names *n, const struct ki_record *rec, uint32_t mark) {
    uint32_t producer = rec->producer, id = rec->rec.id;
    uint16_t chunk = rec->rec.device;
    size_t pos;
    struct ki_name *s = lookup(n, producer, id, &pos);
    if (!s) {
        if (chunk != 0) return; /* the start of this name was lost */
        if (n->used + 1 > n->limit) {
            reset(n);
            lookup(n, producer, id, &pos);
        }
        s = insert(n, pos);
        *s = (struct ki_name){.producer = producer, .id = id, .state = SLOT_BROKEN};
    }
    if (chunk == 0) {
        /* A (re)registration starts a new text at the end of the arena. */
        s->state = SLOT_PARTIAL;
        s->off = (uint32_t)n->arena_used;
        s->len = 0;
        s->cut = 0;
    } else if (s->state != SLOT_PARTIAL || chunk != s->next) {
        /* A chunk went missing: wait for a new chunk 0 (a complete name stays as it is). */
        if (s->state == SLOT_PARTIAL) s->state = SLOT_BROKEN;
        return;
    }
    const char *text = rec->rec.u.string.text;
    size_t take = 32;
    if ((rec->rec.flags & KI_FLAG_STRING_LAST) && (rec->rec.flags & KI_FLAG_STRING_SIZED))
        take = (uint8_t)text[31] < 32 ? (uint8_t)text[31] : 31; /* a name ending in NUL: its byte count */
    else if (rec->rec.flags & KI_FLAG_STRING_LAST)
        while (take > 0 && text[take - 1] == '\0') take--; /* as StringTable: trailing NULs of the last chunk */
    if (s->len + take > n->name_max) {
        take = n->name_max > s->len ? n->name_max - s->len : 0;
        s->cut = 1;
    }
    /* Names registered at the same time interleave: move this one's text to the end first. */
    int move = s->off + s->len != n->arena_used;
    if (n->arena_used + (move ? s->len : 0) + take > n->arena_cap) {
        reset(n);
        if (chunk != 0) return;
        lookup(n, producer, id, &pos);
        s = insert(n, pos);
        *s = (struct ki_name){.producer = producer, .id = id, .state = SLOT_PARTIAL};
    } else if (move) {
        memmove(n->arena + n->arena_used, n->arena + s->off, s->len);
        s->off = (uint32_t)n->arena_used;
        n->arena_used += s->len;
    }
    memcpy(n->arena + n->arena_used, text, take);
    s->len += (uint32_t)take;
    n->arena_used += take;
    s->next = (uint16_t)(chunk + 1);
    if (rec->rec.flags & KI_FLAG_STRING_LAST) {
        s->state = SLOT_COMPLETE;
        s->sent = 0; /* a new text (a registration again) goes out even if the old one went */
        s->mark = mark;
        n->dirty = 1;
        if (s->cut) n->truncated++;
    }
}

int ki_names_mark(struct ki_names *n, uint32_t producer, uint32_t id, uint32_t mark) {
    size_t pos;
    struct ki_name *s = lookup(n, producer, id, &pos);
    if (!s || s->state != SLOT_COMPLETE) return 0;
    s->mark = mark;
    return 1;
}

size_t ki_names_emit_bound(const struct ki_names *n) {
    return KI_VARINT_MAX + n->limit * (3 * KI_VARINT_MAX) + n->arena_cap;
}

uint64_t ki_names_hash(uint32_t producer, uint32_t id, const char *text, size_t len) {
    crypto_generichash_state st;
    uint8_t key[8], h[16];
    memcpy(key, &producer, 4); /* little-endian hosts only, as the encoder */
    memcpy(key + 4, &id, 4);
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, key, sizeof key);
    crypto_generichash_update(&st, (const uint8_t *)text, len);
    crypto_generichash_final(&st, h, sizeof h);
    uint64_t v;
    memcpy(&v, h, 8);
    return v;
}

void ki_names_forget(struct ki_names *n) {
    if (++n->sent_gen == 0) { /* wrapped: clear every mark so that none matches by accident */
        for (size_t i = 0; i < n->used; i++) n->slots[i].sent = 0;
        n->sent_gen = 1;
    }
}

/* The STRINGS payload of the complete names marked with mark (all: every complete name); with
 * once, names sent in this generation are left out and hashed into once->digest. */
static int emit(struct ki_names *n, uint32_t mark, int all, uint8_t *out, size_t cap, size_t *len, size_t *count,
                struct ki_names_once *once) {
    size_t k = 0, off = KI_VARINT_MAX; /* the count goes in front once known */
    if (once) *once = (struct ki_names_once){0};
    for (size_t i = 0; i < n->used; i++) {
        struct ki_name *s = &n->slots[i];
        if (s->state != SLOT_COMPLETE || (!all && s->mark != mark)) continue;
        if (once) {
            once->digest ^= ki_names_hash(s->producer, s->id, n->arena + s->off, s->len);
            if (s->sent == n->sent_gen) {
                once->omitted++;
                continue;
            }
        }
        if (off + 3 * KI_VARINT_MAX + s->len > cap) return -ENOBUFS;
        if (once) s->sent = n->sent_gen;
        off += ki_varint_put(out + off, s->producer);
        off += ki_varint_put(out + off, s->id);
        off += ki_varint_put(out + off, s->len);
        memcpy(out + off, n->arena + s->off, s->len);
        off += s->len;
        k++;
    }
    uint8_t head[KI_VARINT_MAX];
    size_t h = ki_varint_put(head, k);
    memmove(out + h, out + KI_VARINT_MAX, off - KI_VARINT_MAX);
    memcpy(out, head, h);
    *len = off - KI_VARINT_MAX + h;
    *count = k;
    return 0;
}

int ki_names_emit(const struct ki_names *n, uint32_t mark, uint8_t *out, size_t cap, size_t *len, size_t *count) {
    return emit((struct ki_names *)n, mark, 0, out, cap, len, count, NULL); /* without once: read only */
}

int ki_names_emit_once(struct ki_names *n, uint32_t mark, uint8_t *out, size_t cap, size_t *len, size_t *count,
                       struct ki_names_once *once) {
    return emit(n, mark, 0, out, cap, len, count, once);
}

int ki_names_emit_all(const struct ki_names *n, uint8_t *out, size_t cap, size_t *len, size_t *count) {
    return emit((struct ki_names *)n, 0, 1, out, cap, len, count, NULL);
}

size_t ki_names_bytes(const struct ki_names *n) { return n ? n->used * sizeof *n->slots + n->arena_used : 0; }
uint64_t ki_names_resets(const struct ki_names *n) { return n->resets; }
uint64_t ki_names_truncated(const struct ki_names *n) { return n->truncated; }

const char *ki_names_get(const struct ki_names *n, uint32_t producer, uint32_t id, size_t *len) {
    const struct ki_name *s = find(n, producer, id);
    if (!s || s->state != SLOT_COMPLETE) return NULL;
    *len = s->len;
    return n->arena + s->off;
}

static const char NAMES_MAGIC[8] = {'K', 'I', 'N', 'A', 'M', 'E', 'S', '1'};

int ki_names_save(struct ki_names *n, const char *path, uint64_t ring_created_ns) {
    if (!n->dirty) return 0;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    int rc = ki_write_all(fd, NAMES_MAGIC, 8);
    if (rc == 0) rc = ki_write_all(fd, &ring_created_ns, 8);
    for (size_t i = 0; rc == 0 && i < n->used; i++) {
        const struct ki_name *s = &n->slots[i];
        if (s->state != SLOT_COMPLETE) continue;
        uint32_t head[3] = {s->producer, s->id, s->len};
        rc = ki_write_all(fd, head, sizeof head);
        if (rc == 0) rc = ki_write_all(fd, n->arena + s->off, s->len);
    }
    if (close(fd) < 0 && rc == 0) rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0) rc = -errno;
    if (rc < 0) unlink(tmp);
    else n->dirty = 0;
    return rc;
}

int ki_names_load(struct ki_names *n, const char *path, uint64_t ring_created_ns) {
    FILE *f = fopen(path, "rb");
    if (!f) return -errno;
    char magic[8];
    uint64_t created;
    int loaded = 0;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, NAMES_MAGIC, 8) || fread(&created, 8, 1, f) != 1 ||
        created != ring_created_ns) {
        fclose(f);
        return 0; /* another ring's names (or not a names file): start empty */
    }
    uint32_t head[3];
    while (fread(head, sizeof head, 1, f) == 1) {
        uint32_t len = head[2];
        if (len > n->name_max || n->arena_used + len > n->arena_cap || n->used + 1 > n->limit) break;
        size_t pos;
        if (lookup(n, head[0], head[1], &pos)) { /* listed twice: the first stays */
            if (fseek(f, (long)len, SEEK_CUR) != 0) break;
            continue;
        }
        if (fread(n->arena + n->arena_used, 1, len, f) != len) break;
        *insert(n, pos) = (struct ki_name){.producer = head[0], .id = head[1], .off = (uint32_t)n->arena_used,
                                           .len = len, .state = SLOT_COMPLETE};
        n->arena_used += len;
        loaded++;
    }
    fclose(f);
    return loaded;
}
