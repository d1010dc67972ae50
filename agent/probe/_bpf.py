"""The eBPF tracer's kernel side, as the C text bcc compiles (kept in Python so it ships in the wheel).

Launches are aggregated in maps (count, summed host time, log2 histogram per
process, API and function handle) and read by the user side once per drain;
memory, synchronisation and NCCL calls, which are orders of magnitude rarer,
are sent one event each through a BPF ring buffer.  ``FILTER`` is replaced by
the cgroup check (or nothing), ``SAMPLE_N`` by the launch sampling period.
"""

from __future__ import annotations

__all__ = ["BPF_TEXT", "EV_COLLECTIVE", "EV_LAUNCH", "EV_MEMOP", "EV_SYNC", "NAME_LEN"]

NAME_LEN = 192
EV_LAUNCH = 1
EV_MEMOP = 2
EV_SYNC = 3
EV_COLLECTIVE = 4

BPF_TEXT = r"""
#include <uapi/linux/ptrace.h>

#define NAME_LEN __NAME_LEN__
#define SAMPLE_N __SAMPLE_N__
#define LATENCY __LATENCY__
#define HIST_SLOTS 32

struct launch_key { u32 pid; u32 api; u64 fn; };
struct launch_val { u64 count; u64 sum_ns; u64 hist[HIST_SLOTS]; };
struct launch_start_t { u64 ts; u64 fn; u32 api; u32 pad; };
struct fn_key { u32 pid; u32 pad; u64 handle; };
struct name_t { char s[NAME_LEN]; };
struct getfn_t { u64 outp; u64 namep; };
struct call_t { u64 ts; u64 a; u64 b; u64 c; u32 kind; u32 extra; };
struct alloc_key { u32 pid; u32 pad; u64 addr; };
struct comm_t { u32 rank; u32 nranks; };
struct group_t { u32 depth; u32 pad; u64 bytes; u64 ts; };

struct event_t {
    u32 type;      /* EV_* */
    u32 kind;      /* memop kind, sync kind, collective op; launch api */
    u64 ts;        /* bpf_ktime_get_ns at call entry */
    u64 dur;       /* ns from entry to return */
    u64 a;         /* launch fn, memop address, sync handle, collective bytes */
    u64 b;         /* memop bytes, collective communicator */
    u32 pid;
    u32 tid;
    s32 status;    /* the call's return value */
    u32 rank;
    u32 nranks;
    u32 dims[6];   /* launch grid and block */
    u32 pad;
};

BPF_HASH(launches, struct launch_key, struct launch_val, 65536);
BPF_HASH(launch_start, u64, struct launch_start_t, 16384);
BPF_HASH(fnames, struct fn_key, struct name_t, 65536);
BPF_PERCPU_ARRAY(scratch, struct name_t, 1);
BPF_PERCPU_ARRAY(zero_val, struct launch_val, 1);
BPF_HASH(getfn_args, u64, struct getfn_t, 4096);
BPF_HASH(calls, u64, struct call_t, 16384);
BPF_HASH(allocs, struct alloc_key, u64, 1048576);
BPF_HASH(comms, u64, struct comm_t, 4096);
BPF_HASH(groups, u64, struct group_t, 4096);
BPF_ARRAY(sample_ctr, u64, 1);
BPF_RINGBUF_OUTPUT(events, 256);

static __always_inline int skip(void) {
    FILTER
    return 0;
}

/* ---- kernel names: remember handle -> name from the lookups ----------------- */

static __always_inline int getfn_enter(struct pt_regs *ctx) {
    if (skip()) return 0;
    u64 id = bpf_get_current_pid_tgid();
    struct getfn_t a = {PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx)};
    getfn_args.update(&id, &a);
    return 0;
}
int getfn_entry(struct pt_regs *ctx) { return getfn_enter(ctx); }

int getfn_return(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct getfn_t *a = getfn_args.lookup(&id);
    if (!a) return 0;
    struct getfn_t args = *a;
    getfn_args.delete(&id);
    if (PT_REGS_RC(ctx) != 0) return 0;
    struct fn_key k = {};
    k.pid = id >> 32;
    if (bpf_probe_read_user(&k.handle, sizeof k.handle, (void *)args.outp) != 0) return 0;
    int zero = 0;
    struct name_t *n = scratch.lookup(&zero);
    if (!n) return 0;
    if (bpf_probe_read_user_str(n->s, sizeof n->s, (void *)args.namep) < 0) return 0;
    fnames.update(&k, n);
    return 0;
}

/* ---- launches: aggregated in the kernel ------------------------------------- */

static __always_inline void sample_launch(struct pt_regs *ctx, u64 id, u64 fn, u32 api, u64 ts) {
#if SAMPLE_N > 0
    int zero = 0;
    u64 *ctr = sample_ctr.lookup(&zero);
    if (!ctr) return;
    u64 n = __sync_fetch_and_add(ctr, 1);
    if (n % SAMPLE_N != 0) return;
    struct event_t *e = events.ringbuf_reserve(sizeof(struct event_t));
    if (!e) return;
    __builtin_memset(e, 0, sizeof *e);
    e->type = 1;
    e->kind = api;
    e->ts = ts;
    e->a = fn;
    e->pid = id >> 32;
    e->tid = (u32)id;
    if (api == 2) {
        /* cudaLaunchKernel(func, dim3 grid, dim3 block, ...): each dim3 (12 bytes) is two registers */
        u64 g0 = PT_REGS_PARM2(ctx), g1 = PT_REGS_PARM3(ctx), b0 = PT_REGS_PARM4(ctx), b1 = PT_REGS_PARM5(ctx);
        e->dims[0] = (u32)g0; e->dims[1] = g0 >> 32; e->dims[2] = (u32)g1;
        e->dims[3] = (u32)b0; e->dims[4] = b0 >> 32; e->dims[5] = (u32)b1;
    } else {
        /* cuLaunchKernel(f, gx, gy, gz, bx, by, bz, ...): bz is the 7th argument, on the stack */
        e->dims[0] = PT_REGS_PARM2(ctx); e->dims[1] = PT_REGS_PARM3(ctx); e->dims[2] = PT_REGS_PARM4(ctx);
        e->dims[3] = PT_REGS_PARM5(ctx); e->dims[4] = PT_REGS_PARM6(ctx);
        u32 bz = 0;
        bpf_probe_read_user(&bz, sizeof bz, (void *)(PT_REGS_SP(ctx) + 8));
        e->dims[5] = bz;
    }
    events.ringbuf_submit(e, 0);
#endif
}

static __always_inline int launch_enter(struct pt_regs *ctx, u32 api) {
    if (skip()) return 0;
    u64 id = bpf_get_current_pid_tgid();
    u64 ts = bpf_ktime_get_ns();
    u64 fn = PT_REGS_PARM1(ctx);
#if LATENCY
    struct launch_start_t st = {ts, fn, api, 0};
    launch_start.update(&id, &st);
#else
    struct launch_key k = {id >> 32, api, fn};
    int zero = 0;
    struct launch_val *init = zero_val.lookup(&zero);
    if (!init) return 0;
    struct launch_val *v = launches.lookup_or_try_init(&k, init);
    if (v) __sync_fetch_and_add(&v->count, 1);
#endif
    sample_launch(ctx, id, fn, api, ts);
    return 0;
}
int launch_drv_entry(struct pt_regs *ctx) { return launch_enter(ctx, 0); }
int launch_ptsz_entry(struct pt_regs *ctx) { return launch_enter(ctx, 1); }
int launch_rt_entry(struct pt_regs *ctx) { return launch_enter(ctx, 2); }

int launch_return(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct launch_start_t *st = launch_start.lookup(&id);
    if (!st) return 0;
    u64 dur = bpf_ktime_get_ns() - st->ts;
    struct launch_key k = {id >> 32, st->api, st->fn};
    launch_start.delete(&id);
    int zero = 0;
    struct launch_val *init = zero_val.lookup(&zero);
    if (!init) return 0;
    struct launch_val *v = launches.lookup_or_try_init(&k, init);
    if (!v) return 0;
    __sync_fetch_and_add(&v->count, 1);
    __sync_fetch_and_add(&v->sum_ns, dur);
    u32 slot = bpf_log2l(dur);
    if (slot >= HIST_SLOTS) slot = HIST_SLOTS - 1;
    __sync_fetch_and_add(&v->hist[slot], 1);
    return 0;
}

/* ---- calls sent one event each: entry stashes, return emits ---------------- */

/* One pending call per thread and category (memory, sync, NCCL), so a library call made
 * inside another (NCCL allocating, say) does not clobber the outer call's entry. */
#define CAT_MEM 1ULL
#define CAT_SYNC 2ULL
#define CAT_COLL 3ULL
static __always_inline u64 call_key(u64 cat) { return bpf_get_current_pid_tgid() | (cat << 56); }

static __always_inline int stash(u64 cat, u32 kind, u64 a, u64 b, u64 c) {
    if (skip()) return 0;
    u64 key = call_key(cat);
    struct call_t call = {bpf_ktime_get_ns(), a, b, c, kind, 0};
    calls.update(&key, &call);
    return 0;
}

static __always_inline int unstash(u64 cat, struct call_t *out) {
    u64 key = call_key(cat);
    struct call_t *c = calls.lookup(&key);
    if (!c) return -1;
    *out = *c;
    calls.delete(&key);
    return 0;
}

static __always_inline struct event_t *begin(u32 type, struct call_t *call, u64 id, struct pt_regs *ctx) {
    struct event_t *e = events.ringbuf_reserve(sizeof(struct event_t));
    if (!e) return 0;
    __builtin_memset(e, 0, sizeof *e);
    e->type = type;
    e->kind = call->kind;
    e->ts = call->ts;
    e->dur = bpf_ktime_get_ns() - call->ts;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->status = (s32)PT_REGS_RC(ctx);
    return e;
}

/* memory: kind 1 alloc, 2 free, 3 alloc_async, 4 free_async */
int alloc_entry(struct pt_regs *ctx) { return stash(CAT_MEM, 1, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0); }
int alloc_async_entry(struct pt_regs *ctx) { return stash(CAT_MEM, 3, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0); }
int free_entry(struct pt_regs *ctx) { return stash(CAT_MEM, 2, PT_REGS_PARM1(ctx), 0, 0); }
int free_async_entry(struct pt_regs *ctx) { return stash(CAT_MEM, 4, PT_REGS_PARM1(ctx), 0, 0); }

int mem_return(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_t call;
    if (unstash(CAT_MEM, &call)) return 0;
    struct event_t *e = begin(2, &call, id, ctx);
    if (!e) return 0;
    struct alloc_key k = {};
    k.pid = id >> 32;
    if (call.kind == 1 || call.kind == 3) {
        e->b = call.b;
        if (e->status == 0 && bpf_probe_read_user(&k.addr, sizeof k.addr, (void *)call.a) == 0) {
            e->a = k.addr;
            allocs.update(&k, &call.b);
        }
    } else {
        k.addr = call.a;
        e->a = call.a;
        u64 *size = allocs.lookup(&k);
        if (size) {
            e->b = *size;
            if (e->status == 0) allocs.delete(&k);
        }
    }
    events.ringbuf_submit(e, 0);
    return 0;
}

/* synchronisation: kind 1 stream, 2 context, 3 event */
int sync_stream_entry(struct pt_regs *ctx) { return stash(CAT_SYNC, 1, PT_REGS_PARM1(ctx), 0, 0); }
int sync_ctx_entry(struct pt_regs *ctx) { return stash(CAT_SYNC, 2, 0, 0, 0); }
int sync_event_entry(struct pt_regs *ctx) { return stash(CAT_SYNC, 3, PT_REGS_PARM1(ctx), 0, 0); }

int sync_return(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_t call;
    if (unstash(CAT_SYNC, &call)) return 0;
    struct event_t *e = begin(3, &call, id, ctx);
    if (!e) return 0;
    e->a = call.a;
    events.ringbuf_submit(e, 0);
    return 0;
}

/* ---- NCCL ------------------------------------------------------------------ */

static __always_inline u64 dtype_size(u64 dt) {
    switch (dt) {
    case 0: case 1: case 10: case 11: return 1;   /* int8 uint8 fp8e4m3 fp8e5m2 */
    case 6: case 9: return 2;                      /* float16 bfloat16 */
    case 2: case 3: case 7: return 4;              /* int32 uint32 float32 */
    case 4: case 5: case 8: return 8;              /* int64 uint64 float64 */
    }
    return 0;
}

static __always_inline int coll(u32 op, u64 count, u64 dt, u64 comm) {
    if (skip()) return 0;
    u64 bytes = count * dtype_size(dt);
    u64 id = bpf_get_current_pid_tgid();
    struct group_t *g = groups.lookup(&id);
    if (g && g->depth > 0) g->bytes += bytes;
    return stash(CAT_COLL, op, bytes, comm, 0);
}

/* ops: 1 allreduce 2 allgather 3 reducescatter 4 broadcast 5 reduce 6 send 7 recv 8 group 9 alltoall */
int allreduce_entry(struct pt_regs *ctx) { return coll(1, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM6(ctx)); }
int allgather_entry(struct pt_regs *ctx) { return coll(2, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx)); }
int reducescatter_entry(struct pt_regs *ctx) { return coll(3, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM6(ctx)); }
int broadcast_entry(struct pt_regs *ctx) { return coll(4, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM6(ctx)); }
int send_entry(struct pt_regs *ctx) { return coll(6, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), PT_REGS_PARM5(ctx)); }
int recv_entry(struct pt_regs *ctx) { return coll(7, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), PT_REGS_PARM5(ctx)); }

int group_start_entry(struct pt_regs *ctx) {
    if (skip()) return 0;
    u64 id = bpf_get_current_pid_tgid();
    struct group_t fresh = {};
    struct group_t *g = groups.lookup_or_try_init(&id, &fresh);
    if (g) {
        if (g->depth == 0) g->bytes = 0;
        g->depth += 1;
    }
    return 0;
}

int group_end_entry(struct pt_regs *ctx) {
    if (skip()) return 0;
    u64 id = bpf_get_current_pid_tgid();
    struct group_t *g = groups.lookup(&id);
    if (!g) return 0;
    if (g->depth > 0) g->depth -= 1;
    if (g->depth == 0) return stash(CAT_COLL, 8, g->bytes, 0, 0);
    return 0;
}

int coll_return(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_t call;
    if (unstash(CAT_COLL, &call)) return 0;
    struct event_t *e = begin(4, &call, id, ctx);
    if (!e) return 0;
    e->a = call.a;
    e->b = call.b;
    struct comm_t *cm = comms.lookup(&call.b);
    if (cm) {
        e->rank = cm->rank;
        e->nranks = cm->nranks;
    }
    events.ringbuf_submit(e, 0);
    return 0;
}

/* ncclCommInitRank(comm*, nranks, ncclUniqueId id (128 bytes, on the stack), rank): rank is the 3rd register */
int comm_init_entry(struct pt_regs *ctx) {
    return stash(CAT_COLL, 0, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx));
}

int comm_init_return(struct pt_regs *ctx) {
    struct call_t call;
    if (unstash(CAT_COLL, &call)) return 0;
    if (PT_REGS_RC(ctx) != 0) return 0;
    u64 comm = 0;
    if (bpf_probe_read_user(&comm, sizeof comm, (void *)call.a) != 0) return 0;
    struct comm_t cm = {(u32)call.c, (u32)call.b};
    comms.update(&comm, &cm);
    return 0;
}
"""
