/*
 * ringtool: a C producer and consumer for the ring tests.
 *
 *   ringtool produce NAME COUNT TAG [RUN] verifiable KERNEL records; prints "id written dropped lost";
 *                                        with RUN > 1, RUN records at a time, each reservation
 *                                        taking as many as there is room for (ki_ring_reserve +
 *                                        ki_ring_put_n)
 *   ringtool forever NAME TAG            verifiable KERNEL records until killed
 *   ringtool midwrite NAME               reserve a slot, write half a record, then stop forever
 *   ringtool write-all NAME              one record of every type; prints them as JSON lines
 *   ringtool flagged NAME                a name, a KERNEL and a failed MEMOP from a plain handle,
 *                                        then the same from a handle with KI_FLAG_SIMULATED set;
 *                                        prints "plain_id flagged_id bad_flags_rc"
 *   ringtool dump NAME COUNT TIMEOUT_MS  consume up to COUNT records; prints JSON lines
 *   ringtool slow NAME STALL_MS          one record, stalling STALL_MS between reservation and
 *                                        publication; prints the write's result
 *   ringtool paced NAME RATE SECONDS     load for bench/e2e: KERNEL records at RATE/s on GPU 0 over 8
 *                                        names (correlation = attempt number), 16 NVML-like GPU_SAMPLE
 *                                        metrics at 10 Hz; prints "written dropped samples"
 *
 * The verifiable scheme (checked by the Python tests): type KERNEL, id = TAG,
 * device = TAG & 0xffff, ts_ns = seq, end_ns = seq ^ KI_TEST_MIX,
 * stream = TAG * KI_TEST_MUL, correlation = seq, so a torn or mixed record
 * fails at least one equation.
 */
#define _POSIX_C_SOURCE 200809L /* before any system header (see ki_ring.h) */
#include <time.h>

static unsigned stall_ms; /* set by "slow" only */
static void test_stall(void) {
    if (stall_ms) {
        struct timespec ts = {(time_t)(stall_ms / 1000), (long)(stall_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}
#define KI_RING_TEST_AFTER_RESERVE(r, pos) test_stall()

#include "ki_ring.h"

#include <inttypes.h>
#include <stdlib.h>

#define KI_TEST_MIX 0xA5A5A5A55A5A5A5AULL
#define KI_TEST_MUL 0x9E3779B97F4A7C15ULL

static int die(const char *msg) {
    fprintf(stderr, "ringtool: %s\n", msg);
    return 2;
}

static void verifiable(struct ki_rec *rec, uint32_t tag, uint64_t seq) {
    memset(rec, 0, sizeof *rec);
    rec->type = KI_REC_KERNEL;
    rec->id = tag;
    rec->device = (uint16_t)(tag & 0xffff);
    rec->ts_ns = seq;
    rec->u.kernel.end_ns = seq ^ KI_TEST_MIX;
    rec->u.kernel.stream = (uint64_t)tag * KI_TEST_MUL;
    rec->u.kernel.correlation = seq;
}

static int produce(const char *name, uint64_t count, uint32_t tag, int forever, unsigned run) {
    struct ki_ring r;
    char err[256];
    if (run < 1 || run > KI_RING_RESERVE_MAX) return die("RUN must be 1 to KI_RING_RESERVE_MAX");
    if (ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err) < 0) return die(err);
    uint64_t written = 0, dropped = 0, lost = 0;
    struct ki_rec recs[KI_RING_RESERVE_MAX];
    printf("%u\n", r.producer_id);
    fflush(stdout);
    for (uint64_t seq = 0; forever || seq < count; seq += run) {
        unsigned n = forever || count - seq >= run ? run : (unsigned)(count - seq);
        for (unsigned i = 0; i < n; i++) verifiable(&recs[i], tag, seq + i);
        if (run == 1) {
            int rc = ki_ring_write(&r, &recs[0]);
            if (rc == 0)
                written++;
            else if (rc == KI_RING_DROPPED)
                dropped++;
            else
                lost++;
            continue;
        }
        for (unsigned done = 0; done < n;) { /* as many as there is room for, in one step each time */
            uint64_t pos;
            int got = ki_ring_reserve(&r, n - done, &pos);
            if (got < 0) {
                dropped++;
                done++;
                continue;
            }
            unsigned ok = ki_ring_put_n(&r, pos, &recs[done], (unsigned)got);
            written += ok;
            lost += (unsigned)got - ok;
            done += (unsigned)got;
        }
    }
    printf("%u %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", r.producer_id, written, dropped, lost);
    ki_ring_close(&r);
    return 0;
}

/* Die in the middle of a write: the reservation succeeds, publication never comes. */
static int midwrite(const char *name) {
    struct ki_ring r;
    char err[256];
    if (ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err) < 0) return die(err);
    uint64_t pos = __atomic_fetch_add(&r.hdr->head, 1, __ATOMIC_RELAXED);
    struct ki_slot *s = &r.slots[pos & r.mask];
    while (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != pos) { /* wait until the slot is ours */
    }
    s->producer = r.producer_id;
    memset(&s->rec, 0x5A, 24); /* half a record */
    printf("%" PRIu64 "\n", pos);
    fflush(stdout);
    for (;;) pause();
}

static void print_record(const struct ki_record *o) {
    const struct ki_rec *r = &o->rec;
    printf("{\"pos\":%" PRIu64 ",\"producer\":%u,\"type\":%u,\"flags\":%u,\"device\":%u,\"id\":%u,\"ts_ns\":%" PRIu64,
           o->pos, o->producer, r->type, r->flags, r->device, r->id, r->ts_ns);
    switch (r->type) {
    case KI_REC_KERNEL:
        printf(",\"end_ns\":%" PRIu64 ",\"stream\":%" PRIu64 ",\"correlation\":%" PRIu64 ",\"pid\":%u", r->u.kernel.end_ns,
               r->u.kernel.stream, r->u.kernel.correlation, r->u.kernel.pid);
        break;
    case KI_REC_LAUNCH:
        printf(",\"pid\":%u,\"tid\":%u,\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u]", r->u.launch.pid, r->u.launch.tid,
               r->u.launch.grid[0], r->u.launch.grid[1], r->u.launch.grid[2], r->u.launch.block[0], r->u.launch.block[1],
               r->u.launch.block[2]);
        break;
    case KI_REC_MEMOP:
        printf(",\"address\":%" PRIu64 ",\"nbytes\":%" PRIu64 ",\"pid\":%u,\"tid\":%u,\"status\":%d", r->u.memop.address,
               r->u.memop.bytes, r->u.memop.pid, r->u.memop.tid, r->u.memop.status);
        break;
    case KI_REC_COLLECTIVE:
        printf(",\"nbytes\":%" PRIu64 ",\"duration_ns\":%" PRIu64 ",\"comm\":%" PRIu64 ",\"rank\":%u,\"nranks\":%u",
               r->u.collective.bytes, r->u.collective.duration_ns, r->u.collective.comm, r->u.collective.rank,
               r->u.collective.nranks);
        break;
    case KI_REC_SYNC:
        printf(",\"duration_ns\":%" PRIu64 ",\"handle\":%" PRIu64 ",\"pid\":%u,\"tid\":%u", r->u.sync.duration_ns,
               r->u.sync.handle, r->u.sync.pid, r->u.sync.tid);
        break;
    case KI_REC_GPU_SAMPLE:
        printf(",\"value\":%.17g,\"aux\":%" PRIu64, r->u.sample.value, r->u.sample.aux);
        break;
    case KI_REC_FINGERPRINT:
        printf(",\"value\":%" PRIu64, r->u.fingerprint.value);
        break;
    case KI_REC_ERROR:
        printf(",\"code\":%" PRId64 ",\"aux\":%" PRIu64 ",\"pid\":%u,\"detail_id\":%u", r->u.error.code, r->u.error.aux,
               r->u.error.pid, r->u.error.detail_id);
        break;
    case KI_REC_STRING: {
        printf(",\"text\":\"");
        for (int i = 0; i < 32; i++) printf("%02x", (unsigned char)r->u.string.text[i]);
        printf("\"");
        break;
    }
    default:
        break;
    }
    printf("}\n");
}

static int write_all(const char *name) {
    struct ki_ring r;
    char err[256];
    if (ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err) < 0) return die(err);
    int rc = 0;
    const char *gemm = "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn";
    rc |= ki_ring_string(&r, 7, gemm, strlen(gemm));
    rc |= ki_ring_kernel(&r, 7, 3, 1000, 2500, 0xdeadbeef, 42);
    struct ki_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_LAUNCH, rec.id = 7, rec.device = 3, rec.ts_ns = 11;
    rec.u.launch = (struct ki_launch){4242, 4243, {128, 2, 1}, {256, 1, 1}};
    rc |= ki_ring_write(&r, &rec);
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_MEMOP, rec.id = KI_MEM_ALLOC, rec.device = 3, rec.ts_ns = 12, rec.flags = KI_FLAG_FAILED;
    rec.u.memop = (struct ki_memop){0x7f0000001000ULL, 1ULL << 33, 4242, 4244, 2, 0};
    rc |= ki_ring_write(&r, &rec);
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_COLLECTIVE, rec.id = KI_COLL_ALLREDUCE, rec.device = 3, rec.ts_ns = 13;
    rec.u.collective = (struct ki_collective){1 << 20, 350000, 0xc0ffee, 5, 8};
    rc |= ki_ring_write(&r, &rec);
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_SYNC, rec.id = KI_SYNC_STREAM, rec.device = 3, rec.ts_ns = 14;
    rec.u.sync = (struct ki_sync){1234567, 0xabc, 4242, 4245, 0};
    rc |= ki_ring_write(&r, &rec);
    rc |= ki_ring_sample(&r, 17, 3, 15, 0.1 + 0.2, 99);
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_FINGERPRINT, rec.id = KI_FP_MEMORY_TOTAL, rec.device = 3, rec.ts_ns = 16;
    rec.u.fingerprint.value = 80ULL << 30;
    rc |= ki_ring_write(&r, &rec);
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_ERROR, rec.id = KI_ERR_XID, rec.device = 3, rec.ts_ns = 17;
    rec.u.error = (struct ki_error){-79, 3, 4242, 7, 0};
    rc |= ki_ring_write(&r, &rec);
    ki_ring_close(&r);
    return rc ? die("write failed") : 0;
}

static int write_three(struct ki_ring *r) {
    const char *name = "a_kernel_name_long_enough_for_two_chunks";
    int rc = ki_ring_string(r, 1, name, strlen(name));
    rc |= ki_ring_kernel(r, 1, 0, 100, 200, 1, 1);
    struct ki_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.type = KI_REC_MEMOP, rec.id = KI_MEM_ALLOC, rec.ts_ns = 300, rec.flags = KI_FLAG_FAILED;
    rec.u.memop.status = 2;
    rc |= ki_ring_write(r, &rec);
    return rc;
}

static int flagged(const char *name) {
    struct ki_ring plain, sim;
    char err[256];
    if (ki_ring_attach(&plain, name, KI_RING_PRODUCER, err, sizeof err) < 0) return die(err);
    if (ki_ring_attach(&sim, name, KI_RING_PRODUCER, err, sizeof err) < 0) return die(err);
    int bad = ki_ring_set_flags(&sim, KI_FLAG_STRING_LAST); /* refused: a per-record flag */
    int rc = ki_ring_set_flags(&sim, KI_FLAG_SIMULATED);
    rc |= write_three(&plain);
    rc |= write_three(&sim);
    printf("%u %u %d\n", plain.producer_id, sim.producer_id, bad);
    ki_ring_close(&plain);
    ki_ring_close(&sim);
    return rc ? die("write failed") : 0;
}

static int slow(const char *name, unsigned ms) {
    struct ki_ring r;
    char err[256];
    if (ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err) < 0) return die(err);
    struct ki_rec rec;
    verifiable(&rec, 9, 0);
    stall_ms = ms;
    printf("%d\n", ki_ring_write(&r, &rec));
    ki_ring_close(&r);
    return 0;
}

/* What an NVML sampler reads at tick k (10 Hz) of one busy GPU: steady clocks, memory and
 * temperatures that step every few seconds, noisy power and link throughput, energy counting up. */
static double nvml_value(uint32_t metric, uint64_t k, uint64_t *energy_mj) {
    uint64_t h = (k * 0x9E3779B97F4A7C15ULL + metric) >> 40;
    switch (metric) {
    case 1: return 60e9 + (double)((k / 50) % 4) * 1e9;  /* memory used */
    case 2: return 20e9 - (double)((k / 50) % 4) * 1e9;  /* memory free */
    case 4: return 60.0 + (double)((k / 100) % 5);       /* temperature */
    case 5: return 70.0 + (double)((k / 150) % 4);       /* memory temperature */
    case 6: return 400.0 + (double)(h % 1000) / 10.0;    /* power, W */
    case 8: *energy_mj += 40000 + h % 10000; return (double)*energy_mj;
    case 9: case 10: case 11: return 95.0 + (double)((k / 30) % 5); /* utilizations */
    case 12: return 1980.0;                              /* SM clock */
    case 13: return 2619.0;                              /* memory clock */
    case 14: case 15: case 16: case 17: return (double)(10000 + h % 5000); /* PCIe, NVLink */
    default: return 0.0;
    }
}

/* Paced load (bench/e2e): every millisecond, the KERNEL records due by then, with realistic
 * wall-clock times and durations; every 100 ms one sample of 16 NVML metrics. */
static int paced(const char *name, uint64_t rate, double seconds) {
    static const char *kernels[8] = {"ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn",
                                     "flash_fwd_kernel", "rms_norm_kernel", "rotary_embedding_kernel",
                                     "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "softmax_warp_forward",
                                     "vectorized_elementwise_kernel", "reduce_kernel"};
    static const uint32_t metrics[16] = {1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 22};
    struct ki_ring r;
    char err[256];
    if (ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err) < 0) return die(err);
    for (uint32_t i = 0; i < 8; i++)
        if (ki_ring_string(&r, i + 1, kernels[i], strlen(kernels[i])) != 0) return die("cannot write names");
    const uint64_t step = 1000000ULL, t0 = ki_ring_mono_ns(), end = t0 + (uint64_t)(seconds * 1e9);
    uint64_t seq = 0, written = 0, dropped = 0, samples = 0, next_sample = t0, energy = 0, tick = 0;
    for (uint64_t due = t0 + step; due <= end; due += step) {
        uint64_t target = (uint64_t)((double)rate * (double)(due - t0) / 1e9), now = ki_ring_now_ns();
        for (; seq < target; seq++) {
            uint64_t h = seq * 0x9E3779B97F4A7C15ULL;
            uint64_t dur = 4000 + (h >> 40) % 400000; /* 4 us .. 404 us */
            if (ki_ring_kernel(&r, 1 + (uint32_t)((h >> 20) % 8), 0, now, now + dur, 7, seq) == 0)
                written++;
            else
                dropped++;
        }
        if (due >= next_sample) {
            next_sample += 100 * step;
            for (int m = 0; m < 16; m++) {
                double v = nvml_value(metrics[m], tick, &energy);
                if (ki_ring_sample(&r, metrics[m], 0, now, v, 0) == 0)
                    samples++;
                else
                    dropped++;
            }
            tick++;
        }
        struct timespec ts = {(time_t)(due / 1000000000ULL), (long)(due % 1000000000ULL)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
    printf("%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", written, dropped, samples);
    ki_ring_close(&r);
    return 0;
}

static int dump(const char *name, uint64_t count, uint64_t timeout_ms) {
    struct ki_ring_consumer c;
    char err[256];
    if (ki_ring_consumer_open(&c, name, 0, err, sizeof err) < 0) return die(err);
    struct ki_record out[256];
    uint64_t got = 0, deadline = ki_ring_mono_ns() + timeout_ms * 1000000ULL;
    while (got < count && ki_ring_mono_ns() < deadline) {
        size_t want = count - got < 256 ? (size_t)(count - got) : 256;
        size_t n = ki_ring_consume(&c, out, want, ki_ring_mono_ns());
        for (size_t i = 0; i < n; i++) print_record(&out[i]);
        got += n;
        if (n == 0) {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
    }
    ki_ring_consumer_close(&c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return die("usage: ringtool produce|forever|midwrite|write-all|flagged|dump NAME ...");
    const char *cmd = argv[1], *name = argv[2];
    if (!strcmp(cmd, "produce") && argc == 6)
        return produce(name, strtoull(argv[3], NULL, 10), (uint32_t)strtoul(argv[4], NULL, 10), 0,
                       (unsigned)strtoul(argv[5], NULL, 10));
    if (!strcmp(cmd, "produce") && argc == 5)
        return produce(name, strtoull(argv[3], NULL, 10), (uint32_t)strtoul(argv[4], NULL, 10), 0, 1);
    if (!strcmp(cmd, "forever") && argc == 4) return produce(name, 0, (uint32_t)strtoul(argv[3], NULL, 10), 1, 1);
    if (!strcmp(cmd, "midwrite")) return midwrite(name);
    if (!strcmp(cmd, "slow") && argc == 4) return slow(name, (unsigned)strtoul(argv[3], NULL, 10));
    if (!strcmp(cmd, "write-all")) return write_all(name);
    if (!strcmp(cmd, "flagged")) return flagged(name);
    if (!strcmp(cmd, "paced") && argc == 5) return paced(name, strtoull(argv[3], NULL, 10), strtod(argv[4], NULL));
    if (!strcmp(cmd, "dump") && argc == 5) return dump(name, strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    return die("bad arguments");
}
