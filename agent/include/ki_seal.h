/*
 * ki_seal.h - the batch header and its AEAD seal (docs/wire.md, "Header" and "AEAD, keys and nonces").
 *
 * ChaCha20-Poly1305 (IETF) under the agent's enrolled key; the 64-byte header is
 * the associated data; the nonce is epoch || seq, so it is never reused: seq
 * counts batches within an epoch, and the epoch is persisted (fsync) and moved
 * forward before the first batch of each run.
 */
#ifndef KI_SEAL_H
#define KI_SEAL_H

#include <stddef.h>
#include <stdint.h>

#include "ki_wire.h" /* KI_KEY_BYTES, KI_HEADER_BYTES, KI_TAG_BYTES, the AEAD and compression ids */

#define KI_AGENT_ID_BYTES 16u

struct ki_seal {
    uint8_t agent_id[KI_AGENT_ID_BYTES]; /* from the key file */
    uint32_t key_id;                     /* from the key file */
    uint8_t key[KI_KEY_BYTES];           /* from the key file; wiped by ki_seal_wipe */
    uint32_t epoch;                      /* this run's epoch (ki_seal_next_epoch) */
    uint64_t next_seq;                   /* sequence number of the next batch */
};

/* Read the key file (agent_id, key_id, key lines). Refuses a file others can read.
 * Returns 0 or a negative errno with a message in err (never containing the key). */
int ki_seal_load_key(struct ki_seal *s, const char *path, char *err, size_t errlen);

/* Move to a new epoch: max(stored + 1, now_s), written to <dir>/epoch and fsynced
 * before it is used. Resets next_seq to 0. */
int ki_seal_next_epoch(struct ki_seal *s, const char *dir, uint32_t now_s, char *err, size_t errlen);

/* Seal in place: frame[0..64) receives the header, frame[64..64+plen) holds the
 * payload and is encrypted, the tag follows (frame needs 64 + plen + 16 bytes).
 * Uses and advances s->next_seq. Returns 0 or a negative errno. */
int ki_seal_frame(struct ki_seal *s, uint8_t *frame, size_t plen, unsigned compression, uint64_t t_min,
                  uint64_t t_max, uint32_t count, size_t *frame_len);

/* Open a frame sealed under old_key and seal it again in place under s (new header,
 * next sequence number): used after a key change for batches the collector refused.
 * Returns 0, or -EBADMSG when old_key does not open it (the frame is left as it was). */
int ki_seal_reseal(struct ki_seal *s, const uint8_t old_key[KI_KEY_BYTES], uint8_t *frame, size_t len,
                   size_t *frame_len);

/* Read the fields of a sealed frame's header (the spool uses it). Returns 0 or -EINVAL. */
int ki_seal_peek_header(const uint8_t *frame, size_t len, uint32_t *epoch, uint64_t *seq, uint32_t *count);

/* Erase the key from memory. */
void ki_seal_wipe(struct ki_seal *s);

#endif /* KI_SEAL_H */
