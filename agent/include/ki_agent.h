/*
 * ki_agent.h - the agent: drain the ring every tick, seal a batch, spool it, send the spool in order.
 *
 * One thread. Each tick: consume what the ring holds, encode, compress and
 * seal it into batches of at most batch_records records (while a backlog waits,
 * a batch gathers records for up to a second), write each to the spool, then
 * send spooled batches oldest first, several per request when more than one is
 * waiting, until the spool is empty, the collector asks to wait, or the next
 * tick is due. docs/agent.md has
 * the whole story (delivery, spool, backoff, shutdown).
 */
#ifndef KI_AGENT_H
#define KI_AGENT_H

#include <signal.h>
#include <stddef.h>

#include "ki_config.h"
#include "ki_counters.h"
#include "ki_log.h"

struct ki_agent;

/* Everything the agent needs, allocated here once: key, epoch, spool, ring, buffers. NULL with err. */
struct ki_agent *ki_agent_create(const struct ki_config *cfg, const struct ki_log *log, char *err, size_t errlen);

/* Free; accepts NULL. The spool stays on disk. */
void ki_agent_destroy(struct ki_agent *a);

/* Run until *stop becomes non-zero; then drain the ring, seal what is left and try
 * for shutdown_timeout_s to deliver the spool. *reload (SIGHUP) re-reads the key
 * file and ends an authentication pause. Returns 0 or a negative errno. */
int ki_agent_run(struct ki_agent *a, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload);

/* One tick's work (drain, seal, send), for tests. */
int ki_agent_tick(struct ki_agent *a);

/* The agent's counters, as the next batch would carry them. */
const struct ki_counters *ki_agent_counters(const struct ki_agent *a);

/* Keep every kernel span of gpu (every GPU when gpu < 0) that starts before until_real_ns,
 * bypassing the span sampling: the hook for capture windows (docs/wire.md, KI-Capture). */
void ki_agent_capture(struct ki_agent *a, int gpu, uint64_t until_real_ns);

#endif /* KI_AGENT_H */
