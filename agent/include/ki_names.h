/*
 * ki_names.h - reassembly of the ring's STRING chunks into names, keyed by (producer, string id).
 *
 * Fixed capacity, allocated once: an open-addressing table and an append-only
 * text arena. When either fills up, everything is forgotten at once and the
 * reset is counted; names are re-learned as producers register them again
 * (producers register at start, so a reset can leave old ids unnamed: that is
 * what the names_reset counter tells the collector).
 */
#ifndef KI_NAMES_H
#define KI_NAMES_H

#include <stddef.h>
#include <stdint.h>

struct ki_record;
struct ki_names;

/* Room for max_names names and arena_bytes of text; names longer than name_max are cut. NULL on ENOMEM. */
struct ki_names *ki_names_create(size_t max_names, size_t arena_bytes, size_t name_max);

/* Free; accepts NULL. */
void ki_names_destroy(struct ki_names *n);

/* Take one STRING chunk; a name completed by it is marked with mark. */
void ki_names_add(struct ki_names *n, const struct ki_record *rec, uint32_t mark);

/* Mark the name (producer, id) if it is known and complete; returns 1 if it was. */
int ki_names_mark(struct ki_names *n, uint32_t producer, uint32_t id, uint32_t mark);

/* Append the STRINGS section payload (docs/wire.md) of every complete name marked
 * with mark to out (room for cap bytes). Returns 0 and the bytes written in *len,
 * or -ENOBUFS. *count receives the number of names. */
int ki_names_emit(const struct ki_names *n, uint32_t mark, uint8_t *out, size_t cap, size_t *len, size_t *count);

/* What ki_names_emit_once left out and the digest that lets the collector check its copies. */
struct ki_names_once {
    size_t omitted;  /* marked names whose text was left out (sent since the last ki_names_forget) */
    uint64_t digest; /* XOR of ki_names_hash over every marked name, texts left out or not */
};

/* As ki_names_emit, for a body version 5 batch (docs/wire.md, "Names once"): a marked name whose
 * text went into a batch since the last ki_names_forget is left out (only its hash counts in
 * once->digest), the others go in and count as sent from now on. */
int ki_names_emit_once(struct ki_names *n, uint32_t mark, uint8_t *out, size_t cap, size_t *len, size_t *count,
                       struct ki_names_once *once);

/* The STRINGS section payload of every complete name (the names batch an agent sends in front
 * of a batch the collector could not resolve); it marks none as sent. */
int ki_names_emit_all(const struct ki_names *n, uint8_t *out, size_t cap, size_t *len, size_t *count);

/* Forget which texts were sent: the next batches carry each name's text again (after a failed
 * request, a refused batch, or a collector that said it lacks names). */
void ki_names_forget(struct ki_names *n);

/* The wire's name hash (docs/wire.md, NAMES_USED): the first 8 bytes, little-endian, of the
 * 16-byte BLAKE2b of producer (u32 LE), id (u32 LE) and the text. */
uint64_t ki_names_hash(uint32_t producer, uint32_t id, const char *text, size_t len);

/* Upper bound of ki_names_emit's output. */
size_t ki_names_emit_bound(const struct ki_names *n);

/* Times the table was cleared because it was full, and names cut to name_max. */
uint64_t ki_names_resets(const struct ki_names *n);
/* Bytes of records and text in use: what grows with the names (the agent watches it, keep_ring). */
size_t ki_names_bytes(const struct ki_names *n);
uint64_t ki_names_truncated(const struct ki_names *n);

/* Write every complete name to path (temporary file, then rename), tagged with the
 * ring's identity, if any name completed since the last save. Returns 0 or a negative errno. */
int ki_names_save(struct ki_names *n, const char *path, uint64_t ring_created_ns);

/* Load names saved for the same ring (created_ns); other rings' files are ignored.
 * Returns the number of names loaded, or a negative errno (-ENOENT: no file). */
int ki_names_load(struct ki_names *n, const char *path, uint64_t ring_created_ns);

/* The text of a complete name, or NULL (for tests). */
const char *ki_names_get(const struct ki_names *n, uint32_t producer, uint32_t id, size_t *len);

#endif /* KI_NAMES_H */
