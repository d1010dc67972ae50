/*
 * fake_nccl.c - a stand-in libnccl.so.2 with the real NCCL 2 collective entry
 * points and signatures, for the eBPF tracer tests.  Each collective sleeps
 * for fake_nccl_set_op_us() microseconds so host-side latency is observable.
 */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default"), noinline))
typedef int ncclResult_t;
typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;

static long op_us;
static uintptr_t next_comm = 0xc0000;

static ncclResult_t op(ncclComm_t comm) {
    if (!comm) return 4; /* ncclInvalidArgument */
    struct timespec ts = {op_us / 1000000, (op_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    return 0;
}

EXPORT void fake_nccl_set_op_us(long us) { op_us = us; }

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    if (!comm || rank >= nranks) return 4;
    *comm = (ncclComm_t)(next_comm += 0x100);
    return 0;
}

EXPORT ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t dt, ncclRedOp_t o,
                                  ncclComm_t comm, cudaStream_t st) {
    (void)s; (void)r; (void)count; (void)dt; (void)o; (void)st;
    return op(comm);
}
EXPORT ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t dt, ncclComm_t comm,
                                  cudaStream_t st) {
    (void)s; (void)r; (void)sendcount; (void)dt; (void)st;
    return op(comm);
}
EXPORT ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t dt, ncclRedOp_t o,
                                      ncclComm_t comm, cudaStream_t st) {
    (void)s; (void)r; (void)recvcount; (void)dt; (void)o; (void)st;
    return op(comm);
}
EXPORT ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                                  cudaStream_t st) {
    (void)s; (void)r; (void)count; (void)dt; (void)root; (void)st;
    return op(comm);
}
EXPORT ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t st) {
    (void)s; (void)count; (void)dt; (void)peer; (void)st;
    return op(comm);
}
EXPORT ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t st) {
    (void)r; (void)count; (void)dt; (void)peer; (void)st;
    return op(comm);
}
EXPORT ncclResult_t ncclGroupStart(void) { return 0; }
EXPORT ncclResult_t ncclGroupEnd(void) { return op((ncclComm_t)1); }
