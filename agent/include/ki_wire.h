/*
 * ki_wire.h - the batch wire format's constants and column tables (docs/wire.md).
 *
 * Generated from collector/wire.py and agent/records.py
 * (python -m kernel_insight.collector.wire_header --write): edit those.
 */
#ifndef KI_WIRE_H
#define KI_WIRE_H

#include <stdint.h>

#define KI_WIRE_MAGIC "KIWB"
#define KI_WIRE_MAGIC_BYTES 4u
#define KI_WIRE_VERSION 1u
#define KI_HEADER_BYTES 64u
#define KI_TAG_BYTES 16u
#define KI_KEY_BYTES 32u
#define KI_AEAD_CHACHA20_POLY1305 1u
#define KI_COMPRESSION_NONE 0u
#define KI_COMPRESSION_ZSTD 1u
#define KI_BODY_VERSION 1u
#define KI_BODY_VERSION_HISTOGRAMS 2u
#define KI_BODY_VERSION_PDELTA 3u
#define KI_BODY_VERSION_INCREMENTS 4u
#define KI_BODY_VERSION_NAMES_ONCE 5u
#define KI_SECTION_COUNTERS 0x01u
#define KI_SECTION_STRINGS 0x02u
#define KI_SECTION_CAPTURES 0x03u
#define KI_SECTION_HISTOGRAMS 0x04u
#define KI_SECTION_LABELS 0x05u
#define KI_SECTION_NAMES_USED 0x06u
#define KI_SECTION_RECORDS 0x10u
#define KI_STATUS_NAMES_UNKNOWN 424

/* How a column's values are written (docs/wire.md, "Columns"). */
enum ki_col_enc { KI_ENC_DELTA, KI_ENC_UV, KI_ENC_SV, KI_ENC_REL, KI_ENC_U8, KI_ENC_F64, KI_ENC_PDELTA };

/* One column: where the value sits in struct ki_record, its width in bytes, its encoding. */
struct ki_wire_col {
    uint8_t off;
    uint8_t width;
    uint8_t enc; /* enum ki_col_enc */
};

#define KI_WIRE_SHIPPED_TYPES 8 /* record types 1 .. this one are shipped */
#define KI_WIRE_COMMON_COLS 6
#define KI_WIRE_MAX_PAYLOAD_COLS 8
/* Every record's first columns, in wire order. */
#define KI_WIRE_COMMON_COLUMNS {{0, 8, KI_ENC_DELTA}, {8, 4, KI_ENC_UV}, {17, 1, KI_ENC_U8}, {18, 2, KI_ENC_UV}, {20, 4, KI_ENC_UV}, {24, 8, KI_ENC_DELTA}}
/* Each shipped type's payload columns, in wire order, indexed by record type (ki_ring.h). */
#define KI_WIRE_PAYLOAD_COLUMNS \
    { \
        [KI_REC_KERNEL] = {{32, 8, KI_ENC_REL}, {40, 8, KI_ENC_UV}, {48, 8, KI_ENC_DELTA}, {56, 4, KI_ENC_UV}}, \
        [KI_REC_LAUNCH] = {{32, 4, KI_ENC_UV}, {36, 4, KI_ENC_UV}, {40, 4, KI_ENC_UV}, {44, 4, KI_ENC_UV}, {48, 4, KI_ENC_UV}, {52, 4, KI_ENC_UV}, {56, 4, KI_ENC_UV}, {60, 4, KI_ENC_UV}}, \
        [KI_REC_MEMOP] = {{32, 8, KI_ENC_DELTA}, {40, 8, KI_ENC_UV}, {48, 4, KI_ENC_UV}, {52, 4, KI_ENC_UV}, {56, 4, KI_ENC_SV}}, \
        [KI_REC_COLLECTIVE] = {{32, 8, KI_ENC_UV}, {40, 8, KI_ENC_UV}, {48, 8, KI_ENC_UV}, {56, 4, KI_ENC_UV}, {60, 4, KI_ENC_UV}}, \
        [KI_REC_SYNC] = {{32, 8, KI_ENC_UV}, {40, 8, KI_ENC_UV}, {48, 4, KI_ENC_UV}, {52, 4, KI_ENC_UV}}, \
        [KI_REC_GPU_SAMPLE] = {{32, 8, KI_ENC_F64}, {40, 8, KI_ENC_UV}}, \
        [KI_REC_FINGERPRINT] = {{32, 8, KI_ENC_UV}}, \
        [KI_REC_ERROR] = {{32, 8, KI_ENC_SV}, {40, 8, KI_ENC_UV}, {48, 4, KI_ENC_UV}, {52, 4, KI_ENC_UV}}, \
    }
/* How many payload columns each record type has (index 0 unused). */
#define KI_WIRE_PAYLOAD_NCOLS {0, 4, 8, 5, 5, 4, 2, 1, 4}
/* Body version 3 and later: KERNEL's correlation column (payload column
 * 2) as the delta of (correlation - pos). */
#define KI_WIRE_KERNEL_PDELTA_COL 2
#define KI_WIRE_KERNEL_PDELTA_COLUMN {48, 8, KI_ENC_PDELTA}

/* Instance labels (the LABELS section): the collector's enrolment rules (collector/keys.py). */
#define KI_LABELS_MAX 16 /* labels per instance */
#define KI_LABEL_VALUE_MAX 200 /* bytes of one value */
/* Names the collector sets itself (besides every __-prefixed one). */
#define KI_RESERVED_LABELS {"gpu", "gpu_product", "instance", "le", "simulated"}

#endif /* KI_WIRE_H */
