/*
 * ki_loop.h - the agent's tick (loop.c): drain every drain_interval_ms, and earlier when producers
 * write fast enough to fill half the ring before the tick; send in the time between; at SIGTERM
 * seal what is left and deliver the spool for up to shutdown_timeout_s. ki_agent_run and
 * ki_agent_tick (ki_agent.h) are defined there.
 */
#ifndef KI_LOOP_H
#define KI_LOOP_H

#include <signal.h>
#include <stdint.h>

#include "ki_agent_state.h"

/* Drain, and return when to drain next before the tick: once producers, at the rate they wrote
 * since the last drain (what a full ring dropped counted), will have filled half the ring; at
 * least 1 ms, at most an hour from now; UINT64_MAX when they wrote nothing (or no ring yet). */
uint64_t ki_loop_drain_and_pace(struct ki_agent *a);

/* Drain, then send (or wait for answers) until next_tick_ns (monotonic), draining early as
 * ki_loop_drain_and_pace says; returns at once when *stop or *reload is set. */
void ki_loop_tick_until(struct ki_agent *a, uint64_t next_tick_ns, volatile sig_atomic_t *stop,
                        volatile sig_atomic_t *reload);

#endif /* KI_LOOP_H */
