/*
 * ki_resident.h - the agent's own resident memory: how much it is, and the program text only
 * its start ran handed back (docs/agent.md, "Memory").
 */
#ifndef KI_RESIDENT_H
#define KI_RESIDENT_H

#include <stddef.h>
#include <stdint.h>

/* Resident memory now (VmRSS: anonymous, file and shared memory pages mapped) in kB; 0 when
 * /proc/self/statm cannot be read. */
uint64_t ki_resident_kb(void);

/* Unmap the program's text (the executable's read-only and code segments, MADV_DONTNEED): pages
 * only the start ran (settings, keys, the spool's scan, the first connection) leave the resident
 * memory, and what runs after faults back in as it runs. Returns the bytes handed back, or a
 * negative errno. */
long ki_resident_shed_text(void);

#endif /* KI_RESIDENT_H */
