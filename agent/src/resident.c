/* resident.c - the agent's resident memory: read it, hand back the text its start ran (ki_resident.h). */
#define _GNU_SOURCE /* MADV_DONTNEED: posix_madvise's POSIX_MADV_DONTNEED does nothing on Linux */
#include "ki_resident.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* The linker's bounds of the executable's first segments: headers and relocations (read-only),
 * then the code, up to etext. Nothing in them is ever written (relocations write the RELRO and
 * data segments after them), so a page handed back faults in again unchanged. */
extern char __executable_start[], etext[];

uint64_t ki_resident_kb(void) {
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    unsigned long long size, resident;
    if (sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
    return resident * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
}

long ki_resident_shed_text(void) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)__executable_start + page - 1) & ~(page - 1), hi = (uintptr_t)etext & ~(page - 1);
    if (hi <= lo) return 0;
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) < 0) return -errno;
    return (long)(hi - lo);
}
