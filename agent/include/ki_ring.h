/*
 * ki_ring.h - the Kernel Insight shared-memory ring (layout version 2).
 *
 * Header-only C11 implementation of docs/ring.md: many producers (processes
 * and threads), one consumer, lock-free, fixed 64-byte slots in a POSIX
 * shared-memory object.  A producer never blocks: when the ring is full the
 * record is dropped and counted.  Usable from C, C++ and CUDA host code: the
 * atomics are the GCC/Clang __atomic builtins (the C11 memory model, without
 * needing <stdatomic.h>, which C++ and nvcc do not accept on plain fields).
 *
 * Producer:
 *     struct ki_ring r;
 *     char err[256];
 *     if (ki_ring_attach(&r, "/kernel_insight.0", KI_RING_PRODUCER, err, sizeof err) < 0) ...
 *     ki_ring_kernel(&r, name_id, device, start_ns, end_ns, stream, corr);
 *     ki_ring_close(&r);
 *
 * Consumer:
 *     struct ki_ring_consumer c;
 *     ki_ring_consumer_open(&c, "/kernel_insight.0", err, sizeof err);
 *     n = ki_ring_consume(&c, out, 1024, ki_ring_mono_ns());
 *
 * A consumer that must not lose records it has read but not yet made durable
 * (the agent) reads with ki_ring_peek() and frees with ki_ring_commit() once
 * the records are safe; ki_ring_consume() is the two in one call.
 *
 * Every function returns 0 (or a count) on success and a negative errno on
 * failure; functions that can fail for a reason a person must read also fill
 * the caller's err buffer.
 */
#ifndef KI_RING_H
#define KI_RING_H

/* The POSIX interfaces below (shm_open, kill, clock_gettime) need this under
 * -std=c11; include ki_ring.h first or define it on the command line. */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- constants --------------------------------------------------------- */

#define KI_RING_MAGIC 0x0000474E4952494BULL /* "KIRING\0\0" little-endian */
#define KI_RING_VERSION 2u                  /* layout version */
#define KI_RING_RECORD_SIZE 64u             /* bytes per slot */
#define KI_RING_HEADER_SIZE 4096u           /* bytes before the producer table */
#define KI_RING_MAX_PRODUCERS 1024u         /* producer table entries (power of two) */
#define KI_RING_DEFAULT_CAPACITY 32768u     /* slots (power of two) */
#define KI_RING_MIN_CAPACITY 2u
#define KI_RING_MAX_CAPACITY (1ULL << 30)
#define KI_RING_STALL_MIN_NS 2000000ULL        /* a dead writer's slot is skipped after 2 ms */
#define KI_RING_STALL_TIMEOUT_NS 250000000ULL  /* any unpublished slot is skipped after 250 ms */
#define KI_RING_NAME_MAX 255u

/* Record types (docs/ring.md, "Record types"). */
enum ki_rec_type {
    KI_REC_KERNEL = 1,
    KI_REC_LAUNCH = 2,
    KI_REC_MEMOP = 3,
    KI_REC_COLLECTIVE = 4,
    KI_REC_SYNC = 5,
    KI_REC_GPU_SAMPLE = 6,
    KI_REC_FINGERPRINT = 7,
    KI_REC_ERROR = 8,
    KI_REC_STRING = 9,
    KI_REC_TYPE_MAX = 9
};

/* MEMOP kinds (record id field). */
enum ki_memop_kind {
    KI_MEM_ALLOC = 1, KI_MEM_FREE = 2, KI_MEM_ALLOC_ASYNC = 3, KI_MEM_FREE_ASYNC = 4, KI_MEM_MEMCPY = 5, KI_MEM_MEMSET = 6
};
/* SYNC kinds (record id field). */
enum ki_sync_kind { KI_SYNC_STREAM = 1, KI_SYNC_CONTEXT = 2, KI_SYNC_EVENT = 3 };
/* COLLECTIVE ops (record id field). */
enum ki_coll_op {
    KI_COLL_ALLREDUCE = 1, KI_COLL_ALLGATHER = 2, KI_COLL_REDUCESCATTER = 3, KI_COLL_BROADCAST = 4,
    KI_COLL_REDUCE = 5, KI_COLL_SEND = 6, KI_COLL_RECV = 7, KI_COLL_GROUP = 8, KI_COLL_ALLTOALL = 9
};
/* ERROR kinds (record id field). */
enum ki_error_kind { KI_ERR_OOM = 1, KI_ERR_XID = 2, KI_ERR_NCCL_TIMEOUT = 3, KI_ERR_ECC = 4, KI_ERR_CUDA = 5, KI_ERR_OTHER = 6 };
/* FINGERPRINT fields (record id field). */
enum ki_fp_field {
    KI_FP_NAME = 1, KI_FP_UUID = 2, KI_FP_DRIVER_VERSION = 3, KI_FP_CUDA_VERSION = 4,
    KI_FP_MEMORY_TOTAL = 5, KI_FP_NVLINK_LINKS = 6, KI_FP_NVLINK_BANDWIDTH = 7, KI_FP_PCI_BUS_ID = 8,
    KI_FP_SM_COUNT = 9, KI_FP_COMPUTE_CAPABILITY = 10, KI_FP_HOSTNAME = 11, KI_FP_POD = 12,
    KI_FP_NAMESPACE = 13, KI_FP_CONTAINER = 14
};

/* Record flags. */
#define KI_FLAG_FAILED 0x01u      /* MEMOP/COLLECTIVE: the call returned an error */
#define KI_FLAG_SIMULATED 0x02u   /* produced by the simulator, never real hardware */
#define KI_FLAG_LAUNCH_SPAN 0x04u /* LAUNCH: the host side of the KERNEL record with the same pid and correlation,
                                     written by the CUDA-event probe: grid x, y = correlation (low, high 32 bits),
                                     grid z = host ns the span's code took (capped), block x = string id of the
                                     enclosing NVTX range or 0 (CUPTI probe), block y, z = 0 (docs/ring.md) */
#define KI_FLAG_STRING_LAST 0x80u /* STRING: last chunk of the name */
#define KI_FLAG_STRING_SIZED 0x20u /* STRING, last chunk: text[31] is this chunk's byte count (0..31), for names ending in NUL */
#define KI_FLAG_FP_STRING 0x40u   /* FINGERPRINT: value is a string id */
/* Flags a producer handle may OR into every record it writes (ki_ring_set_flags);
 * the others mean something for one record only. */
#define KI_RING_HANDLE_FLAGS KI_FLAG_SIMULATED

/* Open flags. */
#define KI_RING_PRODUCER 0x1 /* allocate a producer id on attach */
#define KI_RING_CREATE 0x2   /* create the object if it does not exist */
#define KI_RING_EXCL 0x4     /* with CREATE: fail if it exists */

/* Producer results beyond 0. */
#define KI_RING_DROPPED (-ENOSPC) /* ring full: record dropped and counted */
#define KI_RING_LOST (-ESTALE)    /* slot abandoned by the consumer before publication */

/* ---- layout ------------------------------------------------------------ */

/* Payload views, 32 bytes each, little-endian (x86-64 and ARM64 are both). */
struct ki_kernel { uint64_t end_ns; uint64_t stream; uint64_t correlation; uint32_t pid; uint32_t reserved; };
struct ki_launch { uint32_t pid; uint32_t tid; uint32_t grid[3]; uint32_t block[3]; };
struct ki_memop { uint64_t address; uint64_t bytes; uint32_t pid; uint32_t tid; int32_t status; uint32_t reserved; };
struct ki_collective { uint64_t bytes; uint64_t duration_ns; uint64_t comm; uint32_t rank; uint32_t nranks; };
struct ki_sync { uint64_t duration_ns; uint64_t handle; uint32_t pid; uint32_t tid; uint64_t reserved; };
struct ki_sample { double value; uint64_t aux; uint64_t reserved[2]; };
struct ki_fingerprint { uint64_t value; uint64_t reserved[3]; };
struct ki_error { int64_t code; uint64_t aux; uint32_t pid; uint32_t detail_id; uint64_t reserved; };
struct ki_string { char text[32]; };

/* One record as producers write it: 48 bytes, the slot's bytes 16..63. */
struct ki_rec {
    uint8_t type;    /* enum ki_rec_type */
    uint8_t flags;   /* KI_FLAG_* */
    uint16_t device; /* GPU index (STRING: chunk index) */
    uint32_t id;     /* name id / kind / op / metric / field, by type */
    uint64_t ts_ns;  /* CLOCK_REALTIME ns (KERNEL: start) */
    union {
        uint8_t raw[32];
        struct ki_kernel kernel;
        struct ki_launch launch;
        struct ki_memop memop;
        struct ki_collective collective;
        struct ki_sync sync;
        struct ki_sample sample;
        struct ki_fingerprint fingerprint;
        struct ki_error error;
        struct ki_string string;
    } u;
};

/* One slot in shared memory (64 bytes, cache-line aligned). */
struct ki_slot {
    uint64_t seq;      /* atomic: free for pos when == pos, published when == pos + 1 */
    uint32_t producer; /* producer id of the writer */
    uint32_t check;    /* ki_ring_checksum(pos, producer, rec) */
    struct ki_rec rec; /* the record */
};

/* What the consumer hands out: the slot image with seq replaced by the position. */
struct ki_record {
    uint64_t pos;      /* ring position the record was read from */
    uint32_t producer; /* producer id of the writer */
    uint32_t check;    /* checksum as verified */
    struct ki_rec rec;
};

struct ki_producer_entry {
    uint32_t id;      /* atomic: producer id owning this entry */
    uint32_t pid;     /* atomic: its process id (liveness checks) */
    uint64_t dropped; /* atomic: records it dropped because the ring was full */
    uint64_t lost;    /* atomic: records whose slot the consumer abandoned */
    uint64_t reserved;
};

struct ki_ring_header {
    /* cache line 0: immutable after creation */
    uint64_t magic;          /* KI_RING_MAGIC, written last by the creator (release) */
    uint32_t version;        /* KI_RING_VERSION */
    uint32_t record_size;    /* KI_RING_RECORD_SIZE */
    uint64_t capacity;       /* slots, power of two */
    uint32_t header_size;    /* bytes from the start of the object to the first slot */
    uint32_t max_producers;  /* producer table entries */
    uint64_t created_ns;     /* CLOCK_REALTIME at creation */
    uint8_t pad0[24];
    char label[64];          /* GPU uuid or index this ring belongs to */
    /* cache lines 2-3: producers */
    uint64_t head;           /* atomic: next position to reserve */
    uint8_t pad1[120];
    /* cache lines 4-5: consumer */
    uint64_t tail;           /* atomic: next position to consume */
    uint32_t consumer_pid;   /* atomic: pid of the attached consumer, 0 if none */
    uint32_t pad2a;
    uint8_t pad2[112];
    /* cache line 6: counters */
    uint64_t dropped;        /* atomic: records dropped because the ring was full */
    uint64_t abandoned;      /* atomic: reserved slots never published, skipped by the consumer */
    uint64_t torn;           /* atomic: records that failed their checksum, skipped */
    uint64_t lost;           /* atomic: late publications refused after abandonment */
    uint64_t consumed;       /* atomic: records handed out by consumers */
    uint32_t next_producer;  /* atomic: next producer id (starts at 1) */
    uint32_t pad3a;
    uint64_t cupti_dropped;  /* atomic: activity records CUPTI dropped in the processes writing here (CUPTI probe) */
    uint64_t cupti_refused;  /* atomic: records the CUPTI probe could not write: the ring was full, or there was
                                no ring for their device (counted in the process's first ring) */
};

struct ki_ring {
    struct ki_ring_header *hdr; /* mapped header */
    struct ki_producer_entry *producers; /* mapped producer table */
    struct ki_slot *slots;      /* mapped slot array */
    uint64_t mask;              /* capacity - 1 */
    size_t map_size;            /* bytes mapped */
    uint32_t producer_id;       /* this handle's producer id, 0 if not a producer */
    uint32_t pid;               /* getpid() at attach */
    uint8_t flags;              /* KI_RING_HANDLE_FLAGS OR-ed into every record written (ki_ring_set_flags) */
    char name[KI_RING_NAME_MAX + 1]; /* shm object name */
};

struct ki_ring_consumer {
    struct ki_ring ring;        /* the attached ring */
    uint64_t stall_pos;         /* position last seen reserved but unpublished */
    uint64_t stall_since_ns;    /* when stall_pos was first seen */
    uint64_t stall_timeout_ns;  /* skip any unpublished slot after this long */
    uint64_t stall_min_ns;      /* skip a dead writer's slot after this long */
    uint64_t abandoned;         /* slots this consumer skipped */
    uint64_t torn;              /* records this consumer rejected */
    uint64_t read_pos;          /* next position to read; [tail, read_pos) is read but not yet freed */
    uint64_t pending;           /* records handed out since the last commit */
    uint64_t held_from;         /* first position read without freeing its slot since the last commit
                                 * (ki_ring_peek_keep); UINT64_MAX: every slot read so far is free
                                 * (ki_ring_consume_keep), the commit only moves tail */
};

struct ki_ring_options {
    uint64_t capacity; /* slots, power of two; 0 = default */
    mode_t mode;       /* 0600 or 0660; 0 = 0600 */
    gid_t gid;         /* group for 0660 rings; (gid_t)-1 = unchanged */
    const char *label; /* GPU uuid or index; NULL = the name */
};

#ifdef __cplusplus
#define KI_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define KI_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif
KI_STATIC_ASSERT(sizeof(struct ki_rec) == 48, "ki_rec must be 48 bytes");
KI_STATIC_ASSERT(sizeof(struct ki_slot) == KI_RING_RECORD_SIZE, "slot must be 64 bytes");
KI_STATIC_ASSERT(sizeof(struct ki_record) == KI_RING_RECORD_SIZE, "record must be 64 bytes");
KI_STATIC_ASSERT(sizeof(struct ki_ring_header) <= KI_RING_HEADER_SIZE, "header too large");
KI_STATIC_ASSERT(offsetof(struct ki_ring_header, head) == 128, "head offset");
KI_STATIC_ASSERT(offsetof(struct ki_ring_header, tail) == 256, "tail offset");
KI_STATIC_ASSERT(offsetof(struct ki_ring_header, dropped) == 384, "counters offset");
KI_STATIC_ASSERT(offsetof(struct ki_ring_header, cupti_dropped) == 432, "probe counters offset");
KI_STATIC_ASSERT(sizeof(struct ki_producer_entry) == 32, "producer entry size");

/* ---- helpers ----------------------------------------------------------- */

#define KI_LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define KI_LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define KI_STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define KI_ADD_RLX(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

static inline uint64_t ki_ring_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline uint64_t ki_ring_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Word i (0..5) of a record, little-endian. */
static inline uint64_t ki_ring__word(const struct ki_rec *rec, unsigned i) {
    uint64_t w;
    memcpy(&w, (const unsigned char *)rec + 8u * i, sizeof w);
    return w;
}

/* The checksum is CRC-32C (Castagnoli) of the slot's position, producer id and record, which
 * x86-64 (SSE4.2) and ARM64 (the CRC32 extension) compute in one instruction per 8 bytes
 * (docs/ring.md, "Checksum"). On x86-64 the functions below carry the target attribute, so the
 * instruction is used whatever the flags; built without -msse4.2 they are called rather than
 * inlined. Elsewhere (or with KI_RING_CRC_SOFTWARE defined) a table gives the same values. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(KI_RING_CRC_SOFTWARE)
#define KI_RING__CRC_FN __attribute__((target("sse4.2")))
KI_RING__CRC_FN static inline uint32_t ki_ring__crc8(uint32_t c, uint64_t w) {
    return (uint32_t)__builtin_ia32_crc32di(c, w);
}
KI_RING__CRC_FN static inline uint32_t ki_ring__crc4(uint32_t c, uint32_t w) { return __builtin_ia32_crc32si(c, w); }
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32) && !defined(KI_RING_CRC_SOFTWARE)
#include <arm_acle.h>
#define KI_RING__CRC_FN
static inline uint32_t ki_ring__crc8(uint32_t c, uint64_t w) { return __crc32cd(c, w); }
static inline uint32_t ki_ring__crc4(uint32_t c, uint32_t w) { return __crc32cw(c, w); }
#else
#define KI_RING__CRC_FN
static const uint32_t ki_ring__crc_table[256] = {
    0x00000000U, 0xF26B8303U, 0xE13B70F7U, 0x1350F3F4U, 0xC79A971FU, 0x35F1141CU, 0x26A1E7E8U, 0xD4CA64EBU,
    0x8AD958CFU, 0x78B2DBCCU, 0x6BE22838U, 0x9989AB3BU, 0x4D43CFD0U, 0xBF284CD3U, 0xAC78BF27U, 0x5E133C24U,
    0x105EC76FU, 0xE235446CU, 0xF165B798U, 0x030E349BU, 0xD7C45070U, 0x25AFD373U, 0x36FF2087U, 0xC494A384U,
    0x9A879FA0U, 0x68EC1CA3U, 0x7BBCEF57U, 0x89D76C54U, 0x5D1D08BFU, 0xAF768BBCU, 0xBC267848U, 0x4E4DFB4BU,
    0x20BD8EDEU, 0xD2D60DDDU, 0xC186FE29U, 0x33ED7D2AU, 0xE72719C1U, 0x154C9AC2U, 0x061C6936U, 0xF477EA35U,
    0xAA64D611U, 0x580F5512U, 0x4B5FA6E6U, 0xB93425E5U, 0x6DFE410EU, 0x9F95C20DU, 0x8CC531F9U, 0x7EAEB2FAU,
    0x30E349B1U, 0xC288CAB2U, 0xD1D83946U, 0x23B3BA45U, 0xF779DEAEU, 0x05125DADU, 0x1642AE59U, 0xE4292D5AU,
    0xBA3A117EU, 0x4851927DU, 0x5B016189U, 0xA96AE28AU, 0x7DA08661U, 0x8FCB0562U, 0x9C9BF696U, 0x6EF07595U,
    0x417B1DBCU, 0xB3109EBFU, 0xA0406D4BU, 0x522BEE48U, 0x86E18AA3U, 0x748A09A0U, 0x67DAFA54U, 0x95B17957U,
    0xCBA24573U, 0x39C9C670U, 0x2A993584U, 0xD8F2B687U, 0x0C38D26CU, 0xFE53516FU, 0xED03A29BU, 0x1F682198U,
    0x5125DAD3U, 0xA34E59D0U, 0xB01EAA24U, 0x42752927U, 0x96BF4DCCU, 0x64D4CECFU, 0x77843D3BU, 0x85EFBE38U,
    0xDBFC821CU, 0x2997011FU, 0x3AC7F2EBU, 0xC8AC71E8U, 0x1C661503U, 0xEE0D9600U, 0xFD5D65F4U, 0x0F36E6F7U,
    0x61C69362U, 0x93AD1061U, 0x80FDE395U, 0x72966096U, 0xA65C047DU, 0x5437877EU, 0x4767748AU, 0xB50CF789U,
    0xEB1FCBADU, 0x197448AEU, 0x0A24BB5AU, 0xF84F3859U, 0x2C855CB2U, 0xDEEEDFB1U, 0xCDBE2C45U, 0x3FD5AF46U,
    0x7198540DU, 0x83F3D70EU, 0x90A324FAU, 0x62C8A7F9U, 0xB602C312U, 0x44694011U, 0x5739B3E5U, 0xA55230E6U,
    0xFB410CC2U, 0x092A8FC1U, 0x1A7A7C35U, 0xE811FF36U, 0x3CDB9BDDU, 0xCEB018DEU, 0xDDE0EB2AU, 0x2F8B6829U,
    0x82F63B78U, 0x709DB87BU, 0x63CD4B8FU, 0x91A6C88CU, 0x456CAC67U, 0xB7072F64U, 0xA457DC90U, 0x563C5F93U,
    0x082F63B7U, 0xFA44E0B4U, 0xE9141340U, 0x1B7F9043U, 0xCFB5F4A8U, 0x3DDE77ABU, 0x2E8E845FU, 0xDCE5075CU,
    0x92A8FC17U, 0x60C37F14U, 0x73938CE0U, 0x81F80FE3U, 0x55326B08U, 0xA759E80BU, 0xB4091BFFU, 0x466298FCU,
    0x1871A4D8U, 0xEA1A27DBU, 0xF94AD42FU, 0x0B21572CU, 0xDFEB33C7U, 0x2D80B0C4U, 0x3ED04330U, 0xCCBBC033U,
    0xA24BB5A6U, 0x502036A5U, 0x4370C551U, 0xB11B4652U, 0x65D122B9U, 0x97BAA1BAU, 0x84EA524EU, 0x7681D14DU,
    0x2892ED69U, 0xDAF96E6AU, 0xC9A99D9EU, 0x3BC21E9DU, 0xEF087A76U, 0x1D63F975U, 0x0E330A81U, 0xFC588982U,
    0xB21572C9U, 0x407EF1CAU, 0x532E023EU, 0xA145813DU, 0x758FE5D6U, 0x87E466D5U, 0x94B49521U, 0x66DF1622U,
    0x38CC2A06U, 0xCAA7A905U, 0xD9F75AF1U, 0x2B9CD9F2U, 0xFF56BD19U, 0x0D3D3E1AU, 0x1E6DCDEEU, 0xEC064EEDU,
    0xC38D26C4U, 0x31E6A5C7U, 0x22B65633U, 0xD0DDD530U, 0x0417B1DBU, 0xF67C32D8U, 0xE52CC12CU, 0x1747422FU,
    0x49547E0BU, 0xBB3FFD08U, 0xA86F0EFCU, 0x5A048DFFU, 0x8ECEE914U, 0x7CA56A17U, 0x6FF599E3U, 0x9D9E1AE0U,
    0xD3D3E1ABU, 0x21B862A8U, 0x32E8915CU, 0xC083125FU, 0x144976B4U, 0xE622F5B7U, 0xF5720643U, 0x07198540U,
    0x590AB964U, 0xAB613A67U, 0xB831C993U, 0x4A5A4A90U, 0x9E902E7BU, 0x6CFBAD78U, 0x7FAB5E8CU, 0x8DC0DD8FU,
    0xE330A81AU, 0x115B2B19U, 0x020BD8EDU, 0xF0605BEEU, 0x24AA3F05U, 0xD6C1BC06U, 0xC5914FF2U, 0x37FACCF1U,
    0x69E9F0D5U, 0x9B8273D6U, 0x88D28022U, 0x7AB90321U, 0xAE7367CAU, 0x5C18E4C9U, 0x4F48173DU, 0xBD23943EU,
    0xF36E6F75U, 0x0105EC76U, 0x12551F82U, 0xE03E9C81U, 0x34F4F86AU, 0xC69F7B69U, 0xD5CF889DU, 0x27A40B9EU,
    0x79B737BAU, 0x8BDCB4B9U, 0x988C474DU, 0x6AE7C44EU, 0xBE2DA0A5U, 0x4C4623A6U, 0x5F16D052U, 0xAD7D5351U,
};
static inline uint32_t ki_ring__crc_bytes(uint32_t c, uint64_t w, unsigned n) {
    for (unsigned i = 0; i < n; i++) c = ki_ring__crc_table[(c ^ (uint32_t)(w >> (8u * i))) & 0xFFu] ^ (c >> 8);
    return c;
}
static inline uint32_t ki_ring__crc8(uint32_t c, uint64_t w) { return ki_ring__crc_bytes(c, w, 8); }
static inline uint32_t ki_ring__crc4(uint32_t c, uint32_t w) { return ki_ring__crc_bytes(c, w, 4); }
#endif

/* CRC-32C of the 60 bytes pos (u64), producer (u32), record (48), little-endian: binds the record
 * to its position and writer, so a record torn by a late writer, or left over from an earlier
 * lap, fails verification. */
KI_RING__CRC_FN static inline uint32_t ki_ring_checksum(uint64_t pos, uint32_t producer, const struct ki_rec *rec) {
    uint32_t c = ki_ring__crc8(0xFFFFFFFFu, pos);
    c = ki_ring__crc4(c, producer);
    c = ki_ring__crc8(c, ki_ring__word(rec, 0));
    c = ki_ring__crc8(c, ki_ring__word(rec, 1));
    c = ki_ring__crc8(c, ki_ring__word(rec, 2));
    c = ki_ring__crc8(c, ki_ring__word(rec, 3));
    c = ki_ring__crc8(c, ki_ring__word(rec, 4));
    c = ki_ring__crc8(c, ki_ring__word(rec, 5));
    return ~c;
}

/* Bit j set for each of the m (<= 32) records whose checksum fails: the consumer's check of a
 * block, in one call (the checksums side by side: independent chains the CPU overlaps). */
KI_RING__CRC_FN static inline uint32_t ki_ring__verify(const struct ki_record *recs, size_t m) {
    uint32_t bad = 0;
    for (size_t j = 0; j < m; j++)
        bad |= (uint32_t)(ki_ring_checksum(recs[j].pos, recs[j].producer, &recs[j].rec) != recs[j].check) << j;
    return bad;
}

static inline size_t ki_ring_object_size(uint64_t capacity) {
    return (size_t)KI_RING_HEADER_SIZE + (size_t)KI_RING_MAX_PRODUCERS * sizeof(struct ki_producer_entry) +
           (size_t)capacity * KI_RING_RECORD_SIZE;
}

/* Join four strings into the caller's error buffer (cut to fit, on purpose). */
static inline int ki_ring__fail(char *err, size_t errlen, int rc, const char *a, const char *b, const char *c,
                                const char *d) {
    if (!err || !errlen) return rc;
    const char *parts[4] = {a, b, c, d};
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        for (const char *p = parts[i]; p && *p && off + 1 < errlen; p++) err[off++] = *p;
    }
    err[off] = '\0';
    return rc;
}

static inline int ki_ring__map(struct ki_ring *r, int fd, size_t size, char *err, size_t errlen) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        return ki_ring__fail(err, errlen, -e, "ring ", r->name, ": mmap failed: ", strerror(e));
    }
    r->hdr = (struct ki_ring_header *)p;
    r->producers = (struct ki_producer_entry *)((char *)p + KI_RING_HEADER_SIZE);
    r->map_size = size;
    return 0;
}

static inline void ki_ring__register_producer(struct ki_ring *r) {
    uint32_t id = __atomic_add_fetch(&r->hdr->next_producer, 1, __ATOMIC_RELAXED);
    if (id == 0) id = __atomic_add_fetch(&r->hdr->next_producer, 1, __ATOMIC_RELAXED);
    struct ki_producer_entry *e = &r->producers[id & (KI_RING_MAX_PRODUCERS - 1)];
    KI_STORE_REL(&e->pid, r->pid);
    __atomic_store_n(&e->dropped, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->lost, 0, __ATOMIC_RELAXED);
    KI_STORE_REL(&e->id, id);
    r->producer_id = id;
}

/* Validate a mapped header against what this code understands. */
static inline int ki_ring__validate(struct ki_ring *r, size_t size, char *err, size_t errlen) {
    const struct ki_ring_header *h = r->hdr;
    char detail[160];
    if (KI_LOAD_ACQ(&h->magic) != KI_RING_MAGIC) {
        snprintf(detail, sizeof detail, "bad magic 0x%016llx (expected 0x%016llx): not a Kernel Insight ring",
                 (unsigned long long)h->magic, (unsigned long long)KI_RING_MAGIC);
        return ki_ring__fail(err, errlen, -EPROTO, "ring ", r->name, ": ", detail);
    }
    if (h->version != KI_RING_VERSION) {
        snprintf(detail, sizeof detail, "layout version %u, this build understands version %u", h->version,
                 KI_RING_VERSION);
        return ki_ring__fail(err, errlen, -EPROTO, "ring ", r->name, ": incompatible ", detail);
    }
    if (h->record_size != KI_RING_RECORD_SIZE) {
        snprintf(detail, sizeof detail, "record size %u bytes, this build uses %u bytes", h->record_size,
                 KI_RING_RECORD_SIZE);
        return ki_ring__fail(err, errlen, -EPROTO, "ring ", r->name, ": incompatible ", detail);
    }
    if (h->capacity < KI_RING_MIN_CAPACITY || h->capacity > KI_RING_MAX_CAPACITY ||
        (h->capacity & (h->capacity - 1)) != 0 || h->header_size != KI_RING_HEADER_SIZE ||
        h->max_producers != KI_RING_MAX_PRODUCERS) {
        snprintf(detail, sizeof detail, "corrupt header (capacity %llu, header size %u, producers %u)",
                 (unsigned long long)h->capacity, h->header_size, h->max_producers);
        return ki_ring__fail(err, errlen, -EPROTO, "ring ", r->name, ": ", detail);
    }
    if (size < ki_ring_object_size(h->capacity)) {
        snprintf(detail, sizeof detail, "object is %zu bytes, its header needs %zu", size,
                 ki_ring_object_size(h->capacity));
        return ki_ring__fail(err, errlen, -EPROTO, "ring ", r->name, ": truncated: ", detail);
    }
    return 0;
}

static inline int ki_ring__set_name(struct ki_ring *r, const char *name, char *err, size_t errlen) {
    size_t n = name ? strlen(name) : 0;
    if (n < 2 || n > KI_RING_NAME_MAX || name[0] != '/' || strchr(name + 1, '/') != NULL)
        return ki_ring__fail(err, errlen, -EINVAL, "invalid ring name '", name ? name : "", "': ",
                             "must be '/' followed by 1-254 characters without '/'");
    memcpy(r->name, name, n + 1);
    return 0;
}

/* ---- lifecycle --------------------------------------------------------- */

/* Create a new ring; fails with -EEXIST if one of that name exists. */
static inline int ki_ring_create(struct ki_ring *r, const char *name, const struct ki_ring_options *opt, int flags,
                                 char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    int rc = ki_ring__set_name(r, name, err, errlen);
    if (rc < 0) return rc;
    uint64_t cap = opt && opt->capacity ? opt->capacity : KI_RING_DEFAULT_CAPACITY;
    if (cap < KI_RING_MIN_CAPACITY || cap > KI_RING_MAX_CAPACITY || (cap & (cap - 1)) != 0)
        return ki_ring__fail(err, errlen, -EINVAL, "ring ", name, ": ", "capacity must be a power of two in [2, 2^30]");
    mode_t mode = opt && opt->mode ? opt->mode : 0600;
    if (mode != 0600 && mode != 0660)
        return ki_ring__fail(err, errlen, -EINVAL, "ring ", name, ": ", "mode must be 0600 or 0660");
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, mode);
    if (fd < 0) {
        int e = errno;
        return ki_ring__fail(err, errlen, -e, "cannot create ring ", name, ": ", strerror(e));
    }
    size_t size = ki_ring_object_size(cap);
    if (fchmod(fd, mode) < 0 || (opt && opt->gid != (gid_t)-1 && opt->gid != 0 && fchown(fd, (uid_t)-1, opt->gid) < 0) ||
        ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return ki_ring__fail(err, errlen, -e, "cannot set up ring ", name, ": ", strerror(e));
    }
    rc = ki_ring__map(r, fd, size, err, errlen);
    close(fd);
    if (rc < 0) {
        shm_unlink(name);
        return rc;
    }
    struct ki_ring_header *h = r->hdr;
    h->version = KI_RING_VERSION;
    h->record_size = KI_RING_RECORD_SIZE;
    h->capacity = cap;
    h->header_size = KI_RING_HEADER_SIZE;
    h->max_producers = KI_RING_MAX_PRODUCERS;
    h->created_ns = ki_ring_now_ns();
    const char *label = opt && opt->label ? opt->label : name + 1;
    if (!(opt && opt->label) && strncmp(label, "kernel_insight.", 15) == 0) label += 15;
    size_t llen = strlen(label) < sizeof h->label - 1 ? strlen(label) : sizeof h->label - 1;
    memcpy(h->label, label, llen); /* the object was zero-filled by ftruncate */
    r->slots = (struct ki_slot *)((char *)r->producers + KI_RING_MAX_PRODUCERS * sizeof(struct ki_producer_entry));
    for (uint64_t i = 0; i < cap; i++) r->slots[i].seq = i;
    r->mask = cap - 1;
    r->pid = (uint32_t)getpid();
    KI_STORE_REL(&h->magic, KI_RING_MAGIC);
    if (flags & KI_RING_PRODUCER) ki_ring__register_producer(r);
    return 0;
}

/* Attach to an existing ring (or create it with KI_RING_CREATE). */
static inline int ki_ring_attach(struct ki_ring *r, const char *name, int flags, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    int rc = ki_ring__set_name(r, name, err, errlen);
    if (rc < 0) return rc;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0 && errno == ENOENT && (flags & KI_RING_CREATE)) {
        rc = ki_ring_create(r, name, NULL, flags, err, errlen);
        if (rc != -EEXIST) return rc;
        fd = shm_open(name, O_RDWR, 0);
    }
    if (fd < 0) {
        int e = errno;
        if (e == EACCES) {
            struct stat st;
            char detail[128] = "permission denied", path[KI_RING_NAME_MAX + 16];
            /* Linux keeps shm objects in /dev/shm, where stat needs no permission on the object. */
            snprintf(path, sizeof path, "/dev/shm%s", name);
            int rfd = -1;
            if (stat(path, &st) == 0 || ((rfd = shm_open(name, O_RDONLY, 0)) >= 0 && fstat(rfd, &st) == 0))
                snprintf(detail, sizeof detail, "permission denied (owner uid %u gid %u, mode %04o; this process uid %u)",
                         (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777), (unsigned)getuid());
            if (rfd >= 0) close(rfd);
            return ki_ring__fail(err, errlen, -EACCES, "cannot attach to ring ", name, ": ", detail);
        }
        return ki_ring__fail(err, errlen, -e, "cannot attach to ring ", name, ": ",
                             e == ENOENT ? "no such ring (is the agent or a producer running?)" : strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return ki_ring__fail(err, errlen, -e, "cannot stat ring ", name, ": ", strerror(e));
    }
    /* A creator may still be initialising: wait up to a second for the magic. */
    for (int i = 0; i < 1000 && (size_t)st.st_size < sizeof(struct ki_ring_header); i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        fstat(fd, &st);
    }
    if ((size_t)st.st_size < sizeof(struct ki_ring_header)) {
        close(fd);
        char detail[64];
        snprintf(detail, sizeof detail, "object is %lld bytes, smaller than a ring header", (long long)st.st_size);
        return ki_ring__fail(err, errlen, -EPROTO, "ring ", name, ": truncated: ", detail);
    }
    rc = ki_ring__map(r, fd, (size_t)st.st_size, err, errlen);
    close(fd);
    if (rc < 0) return rc;
    for (int i = 0; i < 1000 && KI_LOAD_ACQ(&r->hdr->magic) == 0; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    rc = ki_ring__validate(r, (size_t)st.st_size, err, errlen);
    if (rc < 0) {
        munmap(r->hdr, r->map_size);
        memset(r, 0, sizeof *r);
        return rc;
    }
    r->slots = (struct ki_slot *)((char *)r->producers + KI_RING_MAX_PRODUCERS * sizeof(struct ki_producer_entry));
    r->mask = r->hdr->capacity - 1;
    r->pid = (uint32_t)getpid();
    if (flags & KI_RING_PRODUCER) ki_ring__register_producer(r);
    return 0;
}

/* Unmap; safe on a zeroed or already closed ring. */
static inline void ki_ring_close(struct ki_ring *r) {
    if (r && r->hdr) munmap(r->hdr, r->map_size);
    if (r) memset(r, 0, sizeof *r);
}

/* Remove the shm object (mapped handles stay valid until closed). */
static inline int ki_ring_unlink(const char *name) { return shm_unlink(name) < 0 ? -errno : 0; }

/* ---- producer ---------------------------------------------------------- */

/* OR `flags` into the flags byte of every record this handle writes from now on,
 * strings included (0 clears).  This is how a producer of synthetic data marks
 * all of it KI_FLAG_SIMULATED without building records itself.  Only
 * KI_RING_HANDLE_FLAGS are accepted: returns 0 or -EINVAL. */
static inline int ki_ring_set_flags(struct ki_ring *r, unsigned flags) {
    if (flags & ~(unsigned)KI_RING_HANDLE_FLAGS) return -EINVAL;
    r->flags = (uint8_t)flags;
    return 0;
}

/* Reserve up to n slots (1 <= n <= KI_RING_RESERVE_MAX) in a row, from *pos_out on, in one step:
 * one atomic operation on head for records written together (the CUPTI probe's) instead of one
 * each.  Returns the number reserved, 1 to n (fewer when fewer are free), each of which must then
 * be written with ki_ring_put or ki_ring_put_n; or, with no slot free, KI_RING_DROPPED: the ring
 * is full and one record is counted dropped (the caller's next one, as ki_ring_write's). Never
 * blocks. */
#define KI_RING_RESERVE_MAX 16u
static inline int ki_ring_reserve(struct ki_ring *r, unsigned n, uint64_t *pos_out) {
    struct ki_slot *slots = r->slots;
    const uint64_t mask = r->mask;
    uint64_t pos = KI_LOAD_RLX(&r->hdr->head);
    for (;;) {
        int64_t dif = (int64_t)(KI_LOAD_ACQ(&slots[pos & mask].seq) - pos);
        if (dif == 0) {
            /* The free slots in a row. The consumer frees slots in ring order (its release store
             * of each after the ones before), so when the last of the n is free, all n are: one
             * acquire load in the usual case, a count slot by slot only near a full ring. */
            unsigned k = n;
            if (n > 1 && KI_LOAD_ACQ(&slots[(pos + n - 1) & mask].seq) != pos + n - 1) {
                k = 1;
                while (k < n && KI_LOAD_ACQ(&slots[(pos + k) & mask].seq) == pos + k) k++;
            }
            if (__atomic_compare_exchange_n(&r->hdr->head, &pos, pos + k, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                *pos_out = pos;
                return (int)k;
            }
        } else if (dif < 0) {
            KI_ADD_RLX(&r->hdr->dropped, 1);
            KI_ADD_RLX(&r->producers[r->producer_id & (KI_RING_MAX_PRODUCERS - 1)].dropped, 1);
            return KI_RING_DROPPED;
        } else {
            pos = KI_LOAD_RLX(&r->hdr->head);
        }
    }
}

/* Write rec (with the handle's flags OR-ed in) into the slot of pos, reserved by ki_ring_reserve,
 * and publish it.  The checksum is the caller's record's, not the slot's: a writer that stalled
 * past its slot's abandonment and scribbles on it later makes the next writer's record fail its
 * check instead of passing with the scribble in it.  Returns 0 or KI_RING_LOST (the consumer gave
 * the slot up meanwhile, counted). */
static inline int ki_ring_put(struct ki_ring *r, uint64_t pos, const struct ki_rec *rec) {
    struct ki_rec flagged;
    if (r->flags) {
        flagged = *rec;
        flagged.flags |= r->flags;
        rec = &flagged;
    }
    struct ki_slot *s = &r->slots[pos & r->mask];
#ifdef KI_RING_TEST_AFTER_RESERVE
    KI_RING_TEST_AFTER_RESERVE(r, pos); /* tests only: stall or die between reservation and publication */
#endif
    __atomic_store_n(&s->producer, r->producer_id, __ATOMIC_RELAXED);
    memcpy(&s->rec, rec, sizeof *rec);
    s->check = ki_ring_checksum(pos, r->producer_id, rec);
    uint64_t expect = pos;
    if (!__atomic_compare_exchange_n(&s->seq, &expect, pos + 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
        KI_ADD_RLX(&r->hdr->lost, 1);
        KI_ADD_RLX(&r->producers[r->producer_id & (KI_RING_MAX_PRODUCERS - 1)].lost, 1);
        return KI_RING_LOST;
    }
    return 0;
}

/* ki_ring_put of n records into the n slots reserved from pos on (ki_ring_reserve), in one call:
 * the handle's fields are read once for all n. Returns the number published (the others were
 * lost, counted). */
static inline unsigned ki_ring_put_n(struct ki_ring *r, uint64_t pos, const struct ki_rec *recs, unsigned n) {
    if (r->flags) { /* rare (the simulator): record by record, through the flagged copy */
        unsigned ok = 0;
        for (unsigned i = 0; i < n; i++) ok += ki_ring_put(r, pos + i, &recs[i]) == 0;
        return ok;
    }
    /* Locals, not r's fields: the stores into the slots could alias those. */
    struct ki_slot *const slots = r->slots;
    const uint64_t mask = r->mask;
    const uint32_t producer = r->producer_id;
    unsigned ok = 0;
    for (unsigned i = 0; i < n; i++, pos++) {
        struct ki_slot *s = &slots[pos & mask];
#ifdef KI_RING_TEST_AFTER_RESERVE
        KI_RING_TEST_AFTER_RESERVE(r, pos);
#endif
        __atomic_store_n(&s->producer, producer, __ATOMIC_RELAXED);
        memcpy(&s->rec, &recs[i], sizeof recs[i]);
        s->check = ki_ring_checksum(pos, producer, &recs[i]);
        uint64_t expect = pos;
        if (__atomic_compare_exchange_n(&s->seq, &expect, pos + 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
            ok++;
        } else {
            KI_ADD_RLX(&r->hdr->lost, 1);
            KI_ADD_RLX(&r->producers[producer & (KI_RING_MAX_PRODUCERS - 1)].lost, 1);
        }
    }
    return ok;
}

/* Write one record (with the handle's flags OR-ed in).  Never blocks: returns 0,
 * KI_RING_DROPPED (full, counted) or KI_RING_LOST (the consumer gave the slot up, counted). */
static inline int ki_ring_write(struct ki_ring *r, const struct ki_rec *rec) {
    uint64_t pos;
    int rc = ki_ring_reserve(r, 1, &pos);
    return rc < 0 ? rc : ki_ring_put(r, pos, rec);
}

static inline int ki_ring_kernel(struct ki_ring *r, uint32_t name_id, uint16_t device, uint64_t start_ns,
                                 uint64_t end_ns, uint64_t stream, uint64_t correlation) {
    struct ki_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_KERNEL;
    rec.device = device;
    rec.id = name_id;
    rec.ts_ns = start_ns;
    rec.u.kernel.end_ns = end_ns;
    rec.u.kernel.stream = stream;
    rec.u.kernel.correlation = correlation;
    rec.u.kernel.pid = r->pid;
    return ki_ring_write(r, &rec);
}

/* The host side of a CUDA-event span (KI_FLAG_LAUNCH_SPAN, docs/ring.md): launched at ts_ns by thread tid,
 * its code took host_ns; tied to the KERNEL record of the same pid and correlation. */
static inline int ki_ring_launch_span(struct ki_ring *r, uint32_t name_id, uint16_t device, uint64_t ts_ns,
                                      uint32_t tid, uint64_t correlation, uint64_t host_ns) {
    struct ki_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_LAUNCH;
    rec.flags = KI_FLAG_LAUNCH_SPAN;
    rec.device = device;
    rec.id = name_id;
    rec.ts_ns = ts_ns;
    rec.u.launch.pid = r->pid;
    rec.u.launch.tid = tid;
    rec.u.launch.grid[0] = (uint32_t)correlation;
    rec.u.launch.grid[1] = (uint32_t)(correlation >> 32);
    rec.u.launch.grid[2] = host_ns > UINT32_MAX ? UINT32_MAX : (uint32_t)host_ns;
    return ki_ring_write(r, &rec);
}

static inline int ki_ring_sample(struct ki_ring *r, uint32_t metric, uint16_t device, uint64_t ts_ns, double value,
                                 uint64_t aux) {
    struct ki_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_GPU_SAMPLE;
    rec.device = device;
    rec.id = metric;
    rec.ts_ns = ts_ns;
    rec.u.sample.value = value;
    rec.u.sample.aux = aux;
    return ki_ring_write(r, &rec);
}

/* Register a name under an id chosen by the caller (unique per producer):
 * written as STRING records of 32-byte chunks.  The last chunk is NUL-padded;
 * a name that itself ends in NUL is written "sized" instead (its last chunk
 * holds len % 32 bytes, possibly none, and their count in text[31], flag
 * STRING_SIZED), so readers never strip a NUL that belongs to the name.
 * Returns 0 or the first error. */
static inline int ki_ring_string(struct ki_ring *r, uint32_t id, const char *name, size_t len) {
    int sized = len > 0 && name[len - 1] == '\0';
    size_t chunks = sized ? len / 32 + 1 : len == 0 ? 1 : (len + 31) / 32;
    if (chunks > 0xFFFF) return -E2BIG;
    uint64_t now = ki_ring_now_ns();
    for (size_t i = 0; i < chunks; i++) {
        struct ki_rec rec;
        memset(&rec, 0, sizeof rec);
        rec.type = KI_REC_STRING;
        rec.id = id;
        rec.device = (uint16_t)i;
        rec.ts_ns = now;
        size_t n = len - i * 32 < 32 ? len - i * 32 : 32;
        if (n) memcpy(rec.u.string.text, name + i * 32, n);
        if (i == chunks - 1) {
            rec.flags = KI_FLAG_STRING_LAST;
            if (sized) {
                rec.flags |= KI_FLAG_STRING_SIZED;
                rec.u.string.text[31] = (char)n; /* n < 32 here: len / 32 full chunks came before */
            }
        }
        int rc = ki_ring_write(r, &rec);
        if (rc < 0) return rc;
    }
    return 0;
}

/* ---- consumer ---------------------------------------------------------- */

static inline int ki_ring__pid_alive(uint32_t pid) { return pid == 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH; }

/* Attach as the ring's only consumer; a dead consumer's claim is taken over. */
static inline int ki_ring_consumer_open(struct ki_ring_consumer *c, const char *name, int flags, char *err,
                                        size_t errlen) {
    memset(c, 0, sizeof *c);
    int rc = ki_ring_attach(&c->ring, name, flags & KI_RING_CREATE, err, errlen);
    if (rc < 0) return rc;
    uint32_t me = c->ring.pid, cur = KI_LOAD_ACQ(&c->ring.hdr->consumer_pid);
    for (;;) {
        if (cur != 0 && cur != me && ki_ring__pid_alive(cur)) {
            char detail[64];
            snprintf(detail, sizeof detail, "already has a consumer (pid %u)", cur);
            ki_ring_close(&c->ring);
            return ki_ring__fail(err, errlen, -EBUSY, "ring ", name, ": ", detail);
        }
        if (__atomic_compare_exchange_n(&c->ring.hdr->consumer_pid, &cur, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            break;
    }
    c->stall_timeout_ns = KI_RING_STALL_TIMEOUT_NS;
    c->stall_min_ns = KI_RING_STALL_MIN_NS;
    c->stall_pos = UINT64_MAX;
    c->held_from = UINT64_MAX;
    c->read_pos = KI_LOAD_ACQ(&c->ring.hdr->tail);
    return 0;
}

static inline void ki_ring_consumer_close(struct ki_ring_consumer *c) {
    if (!c || !c->ring.hdr) return;
    uint32_t me = c->ring.pid;
    __atomic_compare_exchange_n(&c->ring.hdr->consumer_pid, &me, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    ki_ring_close(&c->ring);
}

/* Published records are copied out and verified in blocks of this many: the checksums of a
 * block are independent chains of multiplications the CPU overlaps (one record's chain alone
 * is ~50 cycles of latency), and the filter gets the block in one call. */
#define KI_RING_PEEK_BLOCK 16u
/* How far ahead the read prefetches: two blocks, so that a slot's line is asked for a whole block's
 * fold before its block is read (one block ahead left the agent waiting on the first load of a
 * slot; two cost less CPU a record: `make bench-histogram`, bench/results/histogram.md). */
#ifndef KI_RING_PREFETCH
#define KI_RING_PREFETCH (2u * KI_RING_PEEK_BLOCK)
#endif

/* Verify the m records copied into recs (their checksums side by side, branch-free), drop the
 * torn ones (counted) keeping the order, and hand the rest to keep (NULL: all kept). *valid
 * gets the number verified; returns the number kept, compacted at the front of recs. */
static inline size_t ki_ring__take(struct ki_ring_consumer *c, struct ki_record *recs, size_t m,
                                   size_t (*keep)(void *arg, struct ki_record *recs, size_t n), void *arg,
                                   size_t *valid) {
    uint32_t bad = ki_ring__verify(recs, m);
    size_t v = m;
    if (bad) { /* rare: a torn record (or one left over from an earlier lap) */
        v = 0;
        for (size_t j = 0; j < m; j++) {
            if (bad >> j & 1u) continue;
            if (v != j) recs[v] = recs[j];
            v++;
        }
        KI_ADD_RLX(&c->ring.hdr->torn, m - v);
        c->torn += m - v;
    }
    *valid = v;
    return keep && v ? keep(arg, recs, v) : v;
}

/* ki_ring_peek_keep: read up to max published records, from the read position on, without freeing
 * their slots (ki_ring_commit frees them; ki_ring_consume_keep, free_read 1, frees them as read), and copy into out those that keep
 * (NULL: all) keeps; *read (may be NULL) is the number read. Returns the number
 * copied.  Each record is copied out of its slot once, into out, and both the
 * checksum and keep see that copy: a late writer scribbling on the slot
 * meanwhile cannot change what was verified.  keep(arg, recs, n) gets the
 * verified records of a block (at most KI_RING_PEEK_BLOCK, in ring order),
 * moves those it keeps to the front of recs (in order) and returns their number;
 * records it declines (the agent's histograms fold them) are overwritten by the
 * next block, so out holds only what is kept.  An unpublished slot whose writer
 * died (after stall_min_ns) or that stays unpublished for stall_timeout_ns is
 * abandoned; a record failing its checksum is skipped; both are counted.
 * now_ns is CLOCK_MONOTONIC (ki_ring_mono_ns).  Producers see the ring full
 * until the commit. */
__attribute__((always_inline)) /* into its two callers, where free_read is a constant */
static inline size_t ki_ring__read(struct ki_ring_consumer *c, struct ki_record *out, size_t max, uint64_t now_ns,
                                   size_t (*keep)(void *arg, struct ki_record *recs, size_t n), void *arg,
                                   size_t *read, int free_read) {
    KI_STATIC_ASSERT(KI_RING_PEEK_BLOCK <= 32, "a block's torn records are a 32-bit mask");
    KI_STATIC_ASSERT(sizeof(struct ki_slot) == sizeof(struct ki_record) && offsetof(struct ki_slot, rec) ==
                     offsetof(struct ki_record, rec), "a record is its slot's image");
    struct ki_ring *r = &c->ring;
    struct ki_ring_header *h = r->hdr;
    const uint64_t cap = r->mask + 1;
    uint64_t pos = c->read_pos;
    const uint64_t end = KI_LOAD_RLX(&h->tail) + cap; /* one lap: the slots beyond are read, not freed */
    if (!free_read && pos < c->held_from) c->held_from = pos; /* the commit frees from here */
    /* Locals, not r's fields: the stores into the slots and into out could alias those, and the
     * compiler would load them again for every slot. */
    struct ki_slot *const slots = r->slots;
    const uint64_t mask = r->mask;
    size_t n = 0, got = 0, m = 0, v; /* out[n, n + m): copied, not yet verified */
    while (got + m < max && pos != end) {
        /* Published slots in a row, up to stop: one lap, and max records in all (the blocks taken
         * meanwhile keep at most as many as they were given, so the room only grows). */
        const uint64_t room = max - got - m;
        const uint64_t stop = end - pos < room ? end : pos + room;
        struct ki_slot *s;
        uint64_t seq;
        for (;;) {
            s = &slots[pos & mask];
            seq = KI_LOAD_ACQ(&s->seq);
            if (seq != pos + 1) goto unpublished;
            /* One read of the slot (producer, check and record), its sequence word replaced. */
            struct ki_record *o = &out[n + m++];
            /* KI_RING_PREFETCH slots ahead, past the array at the end of a lap (a prefetch never
             * faults; the lap's first slots then come unprefetched) */
            const void *ahead = (const void *)((uintptr_t)s + KI_RING_PREFETCH * sizeof *s);
            if (free_read) __builtin_prefetch(ahead, 1); /* for writing: the free stores to it too */
            else __builtin_prefetch(ahead, 0);
            memcpy(o, s, sizeof *o);
            if (free_read) { /* the copy is all that is used from here: the slot is free for the next lap */
                __atomic_store_n(&s->producer, 0, __ATOMIC_RELAXED);
                KI_STORE_REL(&s->seq, pos + cap); /* release: the copy's loads come first */
            }
            o->pos = pos++;
            if (m == KI_RING_PEEK_BLOCK) {
                n += ki_ring__take(c, &out[n], m, keep, arg, &v);
                got += v;
                m = 0;
            }
            if (pos == stop) break;
        }
        continue;
    unpublished:
        if (m) { /* the block so far, before waiting or skipping */
            n += ki_ring__take(c, &out[n], m, keep, arg, &v);
            got += v;
            m = 0;
        }
        if (seq - pos >= cap && seq - pos <= 2 * cap) {
            pos++; /* freed by a consumer that died before advancing tail (and maybe reused) */
        } else if (seq == pos && KI_LOAD_ACQ(&h->head) > pos) {
            /* reserved, not yet published */
            if (c->stall_pos != pos) {
                c->stall_pos = pos;
                c->stall_since_ns = now_ns;
                break;
            }
            uint64_t waited = now_ns - c->stall_since_ns;
            int dead = 0;
            uint32_t writer = KI_LOAD_RLX(&s->producer); /* 0 until the writer names itself */
            if (waited >= c->stall_min_ns && writer != 0) {
                struct ki_producer_entry *e = &r->producers[writer & (KI_RING_MAX_PRODUCERS - 1)];
                dead = KI_LOAD_ACQ(&e->id) == writer && !ki_ring__pid_alive(KI_LOAD_ACQ(&e->pid));
            }
            if (!dead && waited < c->stall_timeout_ns) break;
            uint64_t expect = pos;
            __atomic_store_n(&s->producer, 0, __ATOMIC_RELAXED);
            if (__atomic_compare_exchange_n(&s->seq, &expect, pos + cap, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                KI_ADD_RLX(&h->abandoned, 1);
                c->abandoned++;
                pos++;
            }
            /* else the writer published just now: read it on the next turn */
        } else if (seq == pos) {
            break; /* empty */
        } else {
            /* a sequence no protocol step produces: count and resynchronise */
            KI_ADD_RLX(&h->torn, 1);
            c->torn++;
            KI_STORE_REL(&s->seq, pos + cap);
            pos++;
        }
    }
    if (m) {
        n += ki_ring__take(c, &out[n], m, keep, arg, &v);
        got += v;
    }
    c->read_pos = pos;
    c->pending += got;
    if (read) *read = got;
    return n;
}

static inline size_t ki_ring_peek_keep(struct ki_ring_consumer *c, struct ki_record *out, size_t max, uint64_t now_ns,
                                       size_t (*keep)(void *arg, struct ki_record *recs, size_t n), void *arg,
                                       size_t *read) {
    return ki_ring__read(c, out, max, now_ns, keep, arg, read, 0);
}

/* ki_ring_peek_keep that frees each slot as soon as its record is copied out (before the
 * checksum and keep see the copy), for a consumer that needs nothing from the ring once a record
 * is read: the agent's histogram path, where folded records never go to a batch (docs/ring.md,
 * "Consumer"). Producers may reuse the slots at once; ki_ring_commit still moves tail and counts
 * the records consumed, without another pass over the slots. A consumer that dies before its
 * commit leaves freed slots behind tail, which the next one skips (protocol step 4): what it
 * read is not read again. */
static inline size_t ki_ring_consume_keep(struct ki_ring_consumer *c, struct ki_record *out, size_t max,
                                          uint64_t now_ns, size_t (*keep)(void *arg, struct ki_record *recs, size_t n),
                                          void *arg, size_t *read) {
    return ki_ring__read(c, out, max, now_ns, keep, arg, read, 1);
}

/* ki_ring_peek_keep keeping every record: up to max records copied into out. */
static inline size_t ki_ring_peek(struct ki_ring_consumer *c, struct ki_record *out, size_t max, uint64_t now_ns) {
    return ki_ring_peek_keep(c, out, max, now_ns, NULL, NULL, NULL);
}

/* Free every slot read by ki_ring_peek so far and advance tail. */
static inline void ki_ring_commit(struct ki_ring_consumer *c) {
    struct ki_ring *r = &c->ring;
    struct ki_ring_header *h = r->hdr;
    const uint64_t cap = r->mask + 1;
    uint64_t tail = KI_LOAD_RLX(&h->tail);
    if (tail == c->read_pos) return;
    /* Slots read by ki_ring_consume_keep are free already: only those peeked are freed here. */
    for (uint64_t p = c->held_from > tail ? c->held_from : tail; p < c->read_pos; p++) {
        struct ki_slot *s = &r->slots[p & r->mask];
        if (KI_LOAD_ACQ(&s->seq) == p + 1) {
            /* Clear the writer id so a later stall of this slot never blames a stale writer. */
            __atomic_store_n(&s->producer, 0, __ATOMIC_RELAXED);
            KI_STORE_REL(&s->seq, p + cap);
        }
    }
    KI_STORE_REL(&h->tail, c->read_pos);
    KI_ADD_RLX(&h->consumed, c->pending);
    c->pending = 0;
    c->held_from = UINT64_MAX;
}

/* Read and free in one call: ki_ring_peek then ki_ring_commit. */
static inline size_t ki_ring_consume(struct ki_ring_consumer *c, struct ki_record *out, size_t max, uint64_t now_ns) {
    size_t n = ki_ring_peek(c, out, max, now_ns);
    ki_ring_commit(c);
    return n;
}

#ifdef __cplusplus
}
#endif
#endif /* KI_RING_H */
