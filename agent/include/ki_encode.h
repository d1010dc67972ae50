/*
 * ki_encode.h - consumed ring records to a batch body (docs/wire.md, "Body").
 *
 * All buffers are allocated by ki_encoder_create for the configured batch
 * size; encoding a batch allocates nothing.
 */
#ifndef KI_ENCODE_H
#define KI_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#include "ki_counters.h"

struct ki_record;
struct ki_names;
struct ki_encoder;

/* What encoding found in a batch. */
struct ki_batch_info {
    uint64_t t_min;   /* smallest ts_ns of the shipped records */
    uint64_t t_max;   /* largest ts_ns of the shipped records */
    uint32_t shipped; /* records encoded (STRING chunks and garbage excluded) */
    uint32_t strings; /* STRING chunks taken into the name table */
    uint32_t garbage; /* records of unknown type, skipped */
    uint32_t names;   /* names in the STRINGS section */
    uint32_t omitted; /* names the batch uses whose text it left out (body version 5) */
};

/* An encoder for batches of up to max_records records. NULL on ENOMEM. */
struct ki_encoder *ki_encoder_create(size_t max_records, const struct ki_names *names);

/* Free; accepts NULL. */
void ki_encoder_destroy(struct ki_encoder *e);

/* Make room in the bound for an extra section of up to bytes (call before ki_encoder_bound). */
void ki_encoder_reserve(struct ki_encoder *e, size_t bytes);

/* Body version and extra section of the next ki_encode_body call only: version 2 says the
 * batch's KERNEL records are a sample and the kernels are counted in HISTOGRAMS sections
 * (docs/wire.md); tag 0 / len 0 adds no section. The bytes must stay valid until then. */
void ki_encoder_set_extra(struct ki_encoder *e, uint8_t body_version, uint8_t tag, const uint8_t *section, size_t len);

/* Names once (docs/wire.md, body version 5): when on, the next ki_encode_body call whose body
 * version is 4 sends version 5 instead, leaves out the texts of names sent since the last
 * ki_names_forget and says what it left out in a NAMES_USED section. Off: every batch resolves
 * alone, as before. Applies to the next call only. */
void ki_encoder_set_names_once(struct ki_encoder *e, int on);

/* The next batch uses a name the table does not hold (a kernel histogram's, counted by the caller;
 * the records' are counted by ki_encode_body): then it leaves no text out, since the collector may
 * hold that name and count it in the digest where the agent cannot. */
void ki_encoder_unnamed(struct ki_encoder *e);

/* A body version 5 batch of names only: the STRINGS section of every complete name, nothing else
 * (what an agent sends in front of a batch its collector could not resolve). 0 or -ENOBUFS. */
int ki_encode_names_body(struct ki_encoder *e, const struct ki_names *names, uint8_t *out, size_t cap, size_t *len,
                         size_t *count);

/* Bytes a body of max_records records can take at most (size of the out buffer). */
size_t ki_encoder_bound(const struct ki_encoder *e);

/* Encode n records (n <= max_records) into out. STRING chunks go into names
 * and names used by the batch are shipped; records of unknown type are skipped
 * and counted in info. The COUNTERS section is written last, from counters as
 * they are after the records were counted (the caller updates them from info
 * through the update callback before they are written). Returns 0 or -ENOBUFS. */
int ki_encode_body(struct ki_encoder *e, const struct ki_record *recs, size_t n, struct ki_names *names, uint32_t mark,
                   struct ki_counters *counters, void (*update)(struct ki_counters *, const struct ki_batch_info *, void *),
                   void *update_arg, uint8_t *out, size_t cap, size_t *len, struct ki_batch_info *info);

#endif /* KI_ENCODE_H */
