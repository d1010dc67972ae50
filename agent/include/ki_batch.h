/*
 * ki_batch.h - building batches from drained records (batch.c): stage what the ring holds (or fold
 * it into the kernel histograms), encode, compress, seal and spool a batch; the ring's slots are
 * freed only once the batch is in the spool. Also seals the names batch a 424 asks for.
 */
#ifndef KI_BATCH_H
#define KI_BATCH_H

#include <stddef.h>

#include "ki_agent_state.h"

/* While a backlog waits, a batch gathers records for up to this long (fewer, larger batches). */
#define KI_BATCH_BACKLOG_SEAL_NS KI_NS_PER_S
/* Bytes of histograms per batch (more go in the next ones): small bodies keep the buffers small.
 * A table of more than 1,024 keys exports in quarter sections (ki_kstats_encode); smaller ones in
 * one section. Doubled at start until one histogram of histogram_max_buckets fits. */
#define KI_BATCH_HIST_SECTION_MAX (64u << 10)
#define KI_BATCH_FOLD_READ 256u /* records read from the ring at a time while histograms take them and slots cannot be freed */
#define KI_BATCH_FOLD_COMMIT_MIN 1024u /* records read between frees while folding a backlog, at least */

/* Allocate the batch buffers (staging, histograms section, body, frame) from a->cfg, with a->names
 * and a->labels set. Returns 0, or -1 with err. Freed by ki_batch_destroy. */
int ki_batch_create(struct ki_agent *a, char *err, size_t errlen);
void ki_batch_destroy(struct ki_agent *a);

/* Consume everything the ring holds, sealing a batch per batch_max records, and a heartbeat, a
 * histogram export or a capture window's report when due. Returns 0 or the last seal's negative
 * errno (a spool that refuses is not an error: the records stay in the ring). */
int ki_batch_drain(struct ki_agent *a);

/* Encode, compress, seal and spool the first n staged records (n may be 0: a heartbeat).
 * Returns 0 or a negative errno (an encode or seal failure counted as a spool drop, or the
 * spool's error: the batch stays pending). */
int ki_batch_seal(struct ki_agent *a, size_t n);

/* Seal the names batch (every name this agent knows, body version 5) into buf[0..cap): it is not
 * spooled (lost, it is simply made again). *len its frame length. Returns 0 or a negative errno. */
int ki_batch_seal_names(struct ki_agent *a, uint8_t *buf, size_t cap, size_t *len);

#endif /* KI_BATCH_H */
