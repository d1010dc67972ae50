/*
 * BLAKE2b (RFC 7693), unkeyed, one shot: the hash of collector/rows.py's series_fingerprint
 * (Python's hashlib.blake2b), for the series labels parsed in C (series_labels.c).
 */
#ifndef KI_BLAKE2B_H
#define KI_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>

/* The first outlen (1..64) bytes of BLAKE2b-<8*outlen>(msg) into out. */
void ki_blake2b_hash(uint8_t *out, size_t outlen, const uint8_t *msg, size_t len);

#endif
