/* checksums N: the checksum of N pseudo-random (position, producer, record) triples, one hex
 * value a line. Built twice by tests/ring/test_ring_checksum.py, with the CPU's CRC-32C
 * instruction and with the table ki_ring.h falls back to (-DKI_RING_CRC_SOFTWARE): both must
 * print the same lines. */
#include "ki_ring.h"

#include <inttypes.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (unsigned long i = 0; i < n; i++) {
        uint64_t w[8];
        for (int k = 0; k < 8; k++) { /* xorshift64 */
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w[k] = x;
        }
        struct ki_rec rec;
        memcpy(&rec, &w[2], sizeof rec);
        printf("%08" PRIx32 "\n", ki_ring_checksum(w[0], (uint32_t)w[1], &rec));
    }
    return 0;
}
