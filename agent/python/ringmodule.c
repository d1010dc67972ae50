/*
 * kernel_insight.agent._ring - the ring for Python producers and readers.
 *
 * A thin binding of include/ki_ring.h, so that Python and C share one
 * implementation of the protocol: publication is the header's atomic
 * compare-and-swap with release ordering on every architecture, never a
 * plain memory write from Python.  Producer methods take positional
 * arguments through METH_FASTCALL because they sit on the workload's hot path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <grp.h>

#include "ki_ring.h"

#include <pthread.h>

static PyObject *RingError; /* module state: the exception type, set once at import */

typedef struct {
    PyObject_HEAD
    struct ki_ring ring;
    PyObject *interned; /* dict str -> int: names this producer gave ids */
    PyObject *pending;  /* set of names whose STRING records were dropped */
    uint32_t next_string_id;
} RingObject;

/* A consumer handle. peek_into/read_into run without the GIL, so every use of the mapping
 * holds `lock`: close() waits for a read in progress instead of unmapping under it, and two
 * threads never move read_pos at once. Whoever holds `lock` never waits for the GIL (the
 * GIL-free sections take it after releasing the GIL and drop it before taking the GIL back),
 * so taking `lock` with the GIL held cannot deadlock. */
typedef struct {
    PyObject_HEAD
    struct ki_ring_consumer c;
    pthread_mutex_t lock; /* guards c (the mapping, read_pos) */
    int lock_ready;       /* lock was initialised */
} ConsumerObject;

static PyTypeObject RingType;
static PyTypeObject ConsumerType;

static PyObject *raise_ring_error(int rc, const char *msg) {
    PyObject *args = Py_BuildValue("(is)", -rc, msg);
    if (args) {
        PyErr_SetObject(RingError, args);
        Py_DECREF(args);
    }
    return NULL;
}

static int check_open(struct ki_ring *r) {
    if (r->hdr == NULL) {
        PyErr_SetString(PyExc_ValueError, "ring is closed");
        return -1;
    }
    return 0;
}

/* Parse nargs unsigned integers (with defaults for the optional tail). */
static int parse_u64(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t required, Py_ssize_t total,
                     uint64_t *out, const char *fname) {
    if (nargs < required || nargs > total) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd positional arguments (%zd given)", fname, required,
                     total, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        out[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (out[i] == (uint64_t)-1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "%s(): argument %zd must be an integer in [0, 2**64)", fname, i + 1);
            }
            return -1;
        }
    }
    for (Py_ssize_t i = nargs; i < total; i++) out[i] = 0;
    return 0;
}

static int check_u32(uint64_t v, const char *fname, const char *what) {
    if (v > 0xFFFFFFFFULL) {
        PyErr_Format(PyExc_ValueError, "%s(): %s must fit in 32 bits", fname, what);
        return -1;
    }
    return 0;
}

static PyObject *write_result(RingObject *self, struct ki_rec *rec) {
    return PyLong_FromLong(ki_ring_write(&self->ring, rec));
}

/* ---- Ring -------------------------------------------------------------- */

static PyObject *Ring_new_handle(PyTypeObject *type) {
    RingObject *self = (RingObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->interned = PyDict_New();
    self->pending = PySet_New(NULL);
    self->next_string_id = 1;
    if (!self->interned || !self->pending) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static gid_t group_id(PyObject *group, int *ok) {
    *ok = 1;
    if (group == NULL || group == Py_None) return (gid_t)-1;
    if (PyLong_Check(group)) return (gid_t)PyLong_AsLong(group);
    const char *gname = PyUnicode_AsUTF8(group);
    if (!gname) {
        *ok = 0;
        return 0;
    }
    struct group *g = getgrnam(gname);
    if (!g) {
        PyErr_Format(PyExc_ValueError, "unknown group '%s'", gname);
        *ok = 0;
        return 0;
    }
    return g->gr_gid;
}

/* A handle's record flags from Python: an int with only KI_RING_HANDLE_FLAGS set, checked before
 * any ring is created so a bad value leaves nothing behind. */
static int parse_handle_flags(PyObject *value, unsigned *out) {
    unsigned long v = PyLong_AsUnsignedLong(value);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    if (v & ~(unsigned long)KI_RING_HANDLE_FLAGS) {
        char msg[160]; /* PyErr_Format has no %lx before 3.12 */
        snprintf(msg, sizeof msg,
                 "flags 0x%lx: a handle may only set 0x%x (SIMULATED); the other flags belong to single records", v,
                 (unsigned)KI_RING_HANDLE_FLAGS);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

/* ring.flags = n: OR n into every record this handle writes from now on. */
static int Ring_set_flags(RingObject *self, PyObject *value, void *c) {
    (void)c;
    unsigned flags;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "flags cannot be deleted (set 0 to clear)");
        return -1;
    }
    if (parse_handle_flags(value, &flags) < 0) return -1;
    (void)ki_ring_set_flags(&self->ring, flags); /* cannot fail: checked above */
    return 0;
}

static PyObject *Ring_create(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "capacity", "mode", "group", "label", "producer", "flags", NULL};
    const char *name, *label = NULL;
    unsigned long long capacity = 0;
    unsigned int mode = 0600;
    PyObject *group = NULL, *flags = NULL;
    int producer = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|KIOzp$O:create", kwlist, &name, &capacity, &mode, &group, &label,
                                     &producer, &flags))
        return NULL;
    unsigned handle_flags = 0;
    if (flags && parse_handle_flags(flags, &handle_flags) < 0) return NULL;
    int ok;
    gid_t gid = group_id(group, &ok);
    if (!ok) return NULL;
    RingObject *self = (RingObject *)Ring_new_handle(type);
    if (!self) return NULL;
    struct ki_ring_options opt = {capacity, (mode_t)mode, gid, label};
    char err[256];
    int rc = ki_ring_create(&self->ring, name, &opt, producer ? KI_RING_PRODUCER : 0, err, sizeof err);
    if (rc < 0) {
        Py_DECREF(self);
        return raise_ring_error(rc, err);
    }
    (void)ki_ring_set_flags(&self->ring, handle_flags); /* cannot fail: checked above */
    return (PyObject *)self;
}

static PyObject *Ring_attach(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "create", "producer", "flags", NULL};
    const char *name;
    int create = 0, producer = 1;
    PyObject *flags = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|pp$O:attach", kwlist, &name, &create, &producer, &flags))
        return NULL;
    unsigned handle_flags = 0;
    if (flags && parse_handle_flags(flags, &handle_flags) < 0) return NULL;
    RingObject *self = (RingObject *)Ring_new_handle(type);
    if (!self) return NULL;
    char err[256];
    int open_flags = (create ? KI_RING_CREATE : 0) | (producer ? KI_RING_PRODUCER : 0);
    int rc = ki_ring_attach(&self->ring, name, open_flags, err, sizeof err);
    if (rc < 0) {
        Py_DECREF(self);
        return raise_ring_error(rc, err);
    }
    (void)ki_ring_set_flags(&self->ring, handle_flags); /* cannot fail: checked above */
    return (PyObject *)self;
}

static PyObject *Ring_unlink(PyObject *cls, PyObject *arg) {
    (void)cls;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    int rc = ki_ring_unlink(name);
    if (rc < 0) {
        char err[300];
        snprintf(err, sizeof err, "cannot unlink ring %s: %s", name, strerror(-rc));
        return raise_ring_error(rc, err);
    }
    Py_RETURN_NONE;
}

static void Ring_dealloc(RingObject *self) {
    ki_ring_close(&self->ring);
    Py_XDECREF(self->interned);
    Py_XDECREF(self->pending);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Ring_close(RingObject *self, PyObject *unused) {
    (void)unused;
    ki_ring_close(&self->ring);
    Py_RETURN_NONE;
}

static int require_producer(RingObject *self) {
    if (check_open(&self->ring) < 0) return -1;
    if (self->ring.producer_id == 0) {
        PyErr_SetString(PyExc_ValueError, "ring was attached with producer=False");
        return -1;
    }
    return 0;
}

#define REC_INIT(rec, t, dev, ident, ts)                                                                             \
    struct ki_rec rec;                                                                                               \
    memset(&rec, 0, sizeof rec);                                                                                     \
    rec.type = (t);                                                                                                  \
    rec.device = (uint16_t)(dev);                                                                                    \
    rec.id = (uint32_t)(ident);                                                                                      \
    rec.ts_ns = (ts)

static int check_common(uint64_t *a, const char *f) {
    if (check_u32(a[0], f, "id") < 0) return -1;
    if (a[1] > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "%s(): device must fit in 16 bits", f);
        return -1;
    }
    return 0;
}

/* kernel(name_id, device, start_ns, end_ns, stream=0, correlation=0, pid=self) */
static PyObject *Ring_kernel(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[7];
    if (require_producer(self) < 0 || parse_u64(args, nargs, 4, 7, a, "kernel") < 0 || check_common(a, "kernel") < 0)
        return NULL;
    REC_INIT(rec, KI_REC_KERNEL, a[1], a[0], a[2]);
    rec.u.kernel.end_ns = a[3];
    rec.u.kernel.stream = a[4];
    rec.u.kernel.correlation = a[5];
    rec.u.kernel.pid = nargs > 6 ? (uint32_t)a[6] : self->ring.pid;
    return write_result(self, &rec);
}

/* launch(function_id, device, ts_ns, pid, tid, gx, gy, gz, bx, by, bz) */
static PyObject *Ring_launch(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[11];
    if (require_producer(self) < 0 || parse_u64(args, nargs, 5, 11, a, "launch") < 0 || check_common(a, "launch") < 0)
        return NULL;
    for (int i = 3; i < 11; i++)
        if (check_u32(a[i], "launch", "pid, tid and dimensions") < 0) return NULL;
    REC_INIT(rec, KI_REC_LAUNCH, a[1], a[0], a[2]);
    rec.u.launch.pid = (uint32_t)a[3];
    rec.u.launch.tid = (uint32_t)a[4];
    for (int i = 0; i < 3; i++) {
        rec.u.launch.grid[i] = nargs > 5 + i ? (uint32_t)a[5 + i] : 1;
        rec.u.launch.block[i] = nargs > 8 + i ? (uint32_t)a[8 + i] : 1;
    }
    return write_result(self, &rec);
}

/* launch_span(name_id, device, ts_ns, pid, tid, correlation, host_ns): the host side of a CUDA-event
 * span (KI_FLAG_LAUNCH_SPAN), tied to its KERNEL record by pid and correlation. */
static PyObject *Ring_launch_span(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[7];
    if (require_producer(self) < 0 || parse_u64(args, nargs, 7, 7, a, "launch_span") < 0 ||
        check_common(a, "launch_span") < 0)
        return NULL;
    for (int i = 3; i < 5; i++)
        if (check_u32(a[i], "launch_span", "pid and tid") < 0) return NULL;
    REC_INIT(rec, KI_REC_LAUNCH, a[1], a[0], a[2]);
    rec.flags = KI_FLAG_LAUNCH_SPAN;
    rec.u.launch.pid = (uint32_t)a[3];
    rec.u.launch.tid = (uint32_t)a[4];
    rec.u.launch.grid[0] = (uint32_t)a[5];
    rec.u.launch.grid[1] = (uint32_t)(a[5] >> 32);
    rec.u.launch.grid[2] = a[6] > UINT32_MAX ? UINT32_MAX : (uint32_t)a[6];
    return write_result(self, &rec);
}

/* memop(kind, device, ts_ns, address, nbytes, pid, tid=0, status=0) */
static PyObject *Ring_memop(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[8]; /* status (argument 8) is signed: parsed on its own */
    if (require_producer(self) < 0 || parse_u64(args, nargs < 8 ? nargs : 7, 6, 7, a, "memop") < 0 ||
        check_common(a, "memop") < 0)
        return NULL;
    long status = 0;
    if (nargs == 8) {
        status = PyLong_AsLong(args[7]);
        if (status == -1 && PyErr_Occurred()) return NULL;
    } else if (nargs > 8) {
        PyErr_SetString(PyExc_TypeError, "memop() takes 6 to 8 positional arguments");
        return NULL;
    }
    REC_INIT(rec, KI_REC_MEMOP, a[1], a[0], a[2]);
    rec.u.memop.address = a[3];
    rec.u.memop.bytes = a[4];
    rec.u.memop.pid = (uint32_t)a[5];
    rec.u.memop.tid = (uint32_t)a[6];
    rec.u.memop.status = (int32_t)status;
    if (status != 0) rec.flags |= KI_FLAG_FAILED;
    return write_result(self, &rec);
}

/* collective(op, device, ts_ns, nbytes, duration_ns, comm, rank, nranks, failed=0) */
static PyObject *Ring_collective(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[9];
    if (require_producer(self) < 0 || parse_u64(args, nargs, 8, 9, a, "collective") < 0 ||
        check_common(a, "collective") < 0)
        return NULL;
    REC_INIT(rec, KI_REC_COLLECTIVE, a[1], a[0], a[2]);
    rec.u.collective.bytes = a[3];
    rec.u.collective.duration_ns = a[4];
    rec.u.collective.comm = a[5];
    rec.u.collective.rank = (uint32_t)a[6];
    rec.u.collective.nranks = (uint32_t)a[7];
    if (a[8]) rec.flags |= KI_FLAG_FAILED;
    return write_result(self, &rec);
}

/* sync(kind, device, ts_ns, duration_ns, handle, pid, tid=0) */
static PyObject *Ring_sync(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[7];
    if (require_producer(self) < 0 || parse_u64(args, nargs, 6, 7, a, "sync") < 0 || check_common(a, "sync") < 0)
        return NULL;
    REC_INIT(rec, KI_REC_SYNC, a[1], a[0], a[2]);
    rec.u.sync.duration_ns = a[3];
    rec.u.sync.handle = a[4];
    rec.u.sync.pid = (uint32_t)a[5];
    rec.u.sync.tid = (uint32_t)a[6];
    return write_result(self, &rec);
}

/* sample(metric, device, ts_ns, value, aux=0) */
static PyObject *Ring_sample(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[5];
    if (require_producer(self) < 0) return NULL;
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "sample() takes 4 or 5 positional arguments");
        return NULL;
    }
    if (parse_u64(args, 3, 3, 3, a, "sample") < 0 || check_common(a, "sample") < 0) return NULL;
    double value = PyFloat_AsDouble(args[3]);
    if (value == -1.0 && PyErr_Occurred()) return NULL;
    if (nargs == 5 && parse_u64(args + 4, 1, 1, 1, a + 4, "sample") < 0) return NULL;
    return PyLong_FromLong(ki_ring_sample(&self->ring, (uint32_t)a[0], (uint16_t)a[1], a[2], value, nargs == 5 ? a[4] : 0));
}

/* fingerprint(field, device, ts_ns, value, is_string=0) */
static PyObject *Ring_fingerprint(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[5];
    if (require_producer(self) < 0 || parse_u64(args, nargs, 4, 5, a, "fingerprint") < 0 ||
        check_common(a, "fingerprint") < 0)
        return NULL;
    REC_INIT(rec, KI_REC_FINGERPRINT, a[1], a[0], a[2]);
    rec.u.fingerprint.value = a[3];
    if (a[4]) rec.flags |= KI_FLAG_FP_STRING;
    return write_result(self, &rec);
}

/* error(kind, device, ts_ns, code, aux=0, pid=0, detail_id=0) */
static PyObject *Ring_error(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a[7];
    if (require_producer(self) < 0) return NULL;
    if (nargs < 4 || nargs > 7) {
        PyErr_SetString(PyExc_TypeError, "error() takes 4 to 7 positional arguments");
        return NULL;
    }
    if (parse_u64(args, 3, 3, 3, a, "error") < 0 || check_common(a, "error") < 0) return NULL;
    long long code = PyLong_AsLongLong(args[3]);
    if (code == -1 && PyErr_Occurred()) return NULL;
    if (parse_u64(args + 4, nargs - 4, 0, 3, a + 4, "error") < 0) return NULL;
    if (check_u32(a[5], "error", "pid") < 0 || check_u32(a[6], "error", "detail_id") < 0) return NULL;
    REC_INIT(rec, KI_REC_ERROR, a[1], a[0], a[2]);
    rec.u.error.code = code;
    rec.u.error.aux = a[4];
    rec.u.error.pid = (uint32_t)a[5];
    rec.u.error.detail_id = (uint32_t)a[6];
    return write_result(self, &rec);
}

/* string(id, name) -> status: register a name under a caller-chosen id */
static PyObject *Ring_string(RingObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t id;
    if (require_producer(self) < 0) return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "string() takes 2 positional arguments (id, name)");
        return NULL;
    }
    if (parse_u64(args, 1, 1, 1, &id, "string") < 0 || check_u32(id, "string", "id") < 0) return NULL;
    Py_ssize_t len;
    const char *s;
    if (PyUnicode_Check(args[1])) {
        s = PyUnicode_AsUTF8AndSize(args[1], &len);
    } else if (PyBytes_Check(args[1])) {
        s = PyBytes_AS_STRING(args[1]);
        len = PyBytes_GET_SIZE(args[1]);
    } else {
        PyErr_SetString(PyExc_TypeError, "string(): name must be str or bytes");
        return NULL;
    }
    if (!s) return NULL;
    return PyLong_FromLong(ki_ring_string(&self->ring, (uint32_t)id, s, (size_t)len));
}

/* intern(name) -> id: the id of a name, registering it on first use.  Never
 * raises because the ring is full: the id is returned at once and the
 * registration is retried on the name's next use until it lands. */
static PyObject *Ring_intern(RingObject *self, PyObject *name) {
    if (require_producer(self) < 0) return NULL;
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "intern(): name must be str");
        return NULL;
    }
    PyObject *found = PyDict_GetItemWithError(self->interned, name);
    if (found && (PySet_GET_SIZE(self->pending) == 0 || !PySet_Contains(self->pending, name)))
        return Py_NewRef(found);
    if (!found && PyErr_Occurred()) return NULL;
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(name, &len);
    if (!s) return NULL;
    PyObject *v = found ? Py_NewRef(found) : PyLong_FromUnsignedLong(self->next_string_id++);
    if (!v) return NULL;
    if (!found && PyDict_SetItem(self->interned, name, v) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    int rc = ki_ring_string(&self->ring, (uint32_t)PyLong_AsUnsignedLong(v), s, (size_t)len);
    if ((rc < 0 ? PySet_Add(self->pending, name) : (found ? PySet_Discard(self->pending, name) : 0)) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

/* write_raw(record48) -> status */
static PyObject *Ring_write_raw(RingObject *self, PyObject *arg) {
    if (require_producer(self) < 0) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    if (b.len != (Py_ssize_t)sizeof(struct ki_rec)) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "write_raw(): record must be %zu bytes", sizeof(struct ki_rec));
        return NULL;
    }
    struct ki_rec rec;
    memcpy(&rec, b.buf, sizeof rec);
    PyBuffer_Release(&b);
    return write_result(self, &rec);
}

static PyObject *header_stats(struct ki_ring *r) {
    struct ki_ring_header *h = r->hdr;
    uint64_t head = KI_LOAD_ACQ(&h->head), tail = KI_LOAD_ACQ(&h->tail);
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsIsIsKsK}", "capacity", (unsigned long long)h->capacity, "head",
                         (unsigned long long)head, "tail", (unsigned long long)tail, "fill",
                         (unsigned long long)(head - tail), "dropped", (unsigned long long)KI_LOAD_RLX(&h->dropped),
                         "abandoned", (unsigned long long)KI_LOAD_RLX(&h->abandoned), "torn",
                         (unsigned long long)KI_LOAD_RLX(&h->torn), "lost", (unsigned long long)KI_LOAD_RLX(&h->lost),
                         "consumed", (unsigned long long)KI_LOAD_RLX(&h->consumed), "consumer_pid",
                         KI_LOAD_RLX(&h->consumer_pid), "producers", KI_LOAD_RLX(&h->next_producer),
                         "cupti_dropped", (unsigned long long)KI_LOAD_RLX(&h->cupti_dropped), "cupti_refused",
                         (unsigned long long)KI_LOAD_RLX(&h->cupti_refused));
}

static PyObject *Ring_stats(RingObject *self, PyObject *unused) {
    (void)unused;
    if (check_open(&self->ring) < 0) return NULL;
    return header_stats(&self->ring);
}

/* producer_stats(id) -> {"pid", "dropped", "lost"} for a producer id (None if its entry was reused). */
static PyObject *producer_stats(struct ki_ring *r, uint64_t id) {
    struct ki_producer_entry *e = &r->producers[id & (KI_RING_MAX_PRODUCERS - 1)];
    if (KI_LOAD_ACQ(&e->id) != id) Py_RETURN_NONE;
    return Py_BuildValue("{sIsKsK}", "pid", KI_LOAD_RLX(&e->pid), "dropped",
                         (unsigned long long)KI_LOAD_RLX(&e->dropped), "lost", (unsigned long long)KI_LOAD_RLX(&e->lost));
}

static PyObject *Ring_producer_stats(RingObject *self, PyObject *arg) {
    if (check_open(&self->ring) < 0) return NULL;
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (id == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return producer_stats(&self->ring, id);
}

static PyObject *Ring_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *Ring_exit(RingObject *self, PyObject *args) {
    (void)args;
    ki_ring_close(&self->ring);
    Py_RETURN_FALSE;
}

static PyObject *Ring_get_producer_id(RingObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLong(self->ring.producer_id);
}
static PyObject *Ring_get_name(RingObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(self->ring.name);
}
static PyObject *Ring_get_capacity(RingObject *self, void *c) {
    (void)c;
    if (check_open(&self->ring) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(self->ring.hdr->capacity);
}
static PyObject *Ring_get_label(RingObject *self, void *c) {
    (void)c;
    if (check_open(&self->ring) < 0) return NULL;
    return PyUnicode_FromStringAndSize(self->ring.hdr->label, (Py_ssize_t)strnlen(self->ring.hdr->label, 64));
}
static PyObject *Ring_get_flags(RingObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLong(self->ring.flags);
}
static PyObject *Ring_get_closed(RingObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(self->ring.hdr == NULL);
}

static PyMethodDef Ring_methods[] = {
    {"create", (PyCFunction)(void (*)(void))Ring_create, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "create(name, capacity=32768, mode=0o600, group=None, label=None, producer=True, *, flags=0) -> Ring"},
    {"attach", (PyCFunction)(void (*)(void))Ring_attach, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "attach(name, create=False, producer=True, *, flags=0) -> Ring"},
    {"unlink", (PyCFunction)Ring_unlink, METH_O | METH_CLASS, "unlink(name): remove the shared-memory object"},
    {"close", (PyCFunction)Ring_close, METH_NOARGS, "unmap the ring"},
    {"kernel", (PyCFunction)(void (*)(void))Ring_kernel, METH_FASTCALL,
     "kernel(name_id, device, start_ns, end_ns, stream=0, correlation=0, pid=self) -> status"},
    {"launch", (PyCFunction)(void (*)(void))Ring_launch, METH_FASTCALL,
     "launch(function_id, device, ts_ns, pid, tid, gx=1, gy=1, gz=1, bx=1, by=1, bz=1) -> status"},
    {"launch_span", (PyCFunction)(void (*)(void))Ring_launch_span, METH_FASTCALL,
     "launch_span(name_id, device, ts_ns, pid, tid, correlation, host_ns) -> status: the host side of a "
     "CUDA-event span, tied to its kernel record by pid and correlation"},
    {"memop", (PyCFunction)(void (*)(void))Ring_memop, METH_FASTCALL,
     "memop(kind, device, ts_ns, address, nbytes, pid, tid=0, status=0) -> status"},
    {"collective", (PyCFunction)(void (*)(void))Ring_collective, METH_FASTCALL,
     "collective(op, device, ts_ns, nbytes, duration_ns, comm, rank, nranks, failed=0) -> status"},
    {"sync", (PyCFunction)(void (*)(void))Ring_sync, METH_FASTCALL,
     "sync(kind, device, ts_ns, duration_ns, handle, pid, tid=0) -> status"},
    {"sample", (PyCFunction)(void (*)(void))Ring_sample, METH_FASTCALL,
     "sample(metric, device, ts_ns, value, aux=0) -> status"},
    {"fingerprint", (PyCFunction)(void (*)(void))Ring_fingerprint, METH_FASTCALL,
     "fingerprint(field, device, ts_ns, value, is_string=0) -> status"},
    {"error", (PyCFunction)(void (*)(void))Ring_error, METH_FASTCALL,
     "error(kind, device, ts_ns, code, aux=0, pid=0, detail_id=0) -> status"},
    {"string", (PyCFunction)(void (*)(void))Ring_string, METH_FASTCALL, "string(id, name) -> status"},
    {"intern", (PyCFunction)Ring_intern, METH_O, "intern(name) -> id, registering the name on first use"},
    {"write_raw", (PyCFunction)Ring_write_raw, METH_O, "write_raw(record: 48 bytes) -> status"},
    {"stats", (PyCFunction)Ring_stats, METH_NOARGS, "ring counters"},
    {"producer_stats", (PyCFunction)Ring_producer_stats, METH_O, "producer_stats(id) -> dict or None"},
    {"__enter__", (PyCFunction)Ring_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Ring_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Ring_getset[] = {
    {"producer_id", (getter)Ring_get_producer_id, NULL, "this handle's producer id", NULL},
    {"name", (getter)Ring_get_name, NULL, "shm object name", NULL},
    {"capacity", (getter)Ring_get_capacity, NULL, "slots", NULL},
    {"label", (getter)Ring_get_label, NULL, "GPU label", NULL},
    {"closed", (getter)Ring_get_closed, NULL, "whether close() was called", NULL},
    {"flags", (getter)Ring_get_flags, (setter)Ring_set_flags,
     "record flags OR-ed into every record this handle writes, strings included (only SIMULATED)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kernel_insight.agent._ring.Ring",
    .tp_basicsize = sizeof(RingObject),
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A producer handle on a shared-memory ring; build with Ring.attach() or Ring.create().",
    .tp_methods = Ring_methods,
    .tp_getset = Ring_getset,
};

/* ---- Consumer ---------------------------------------------------------- */

static PyObject *Consumer_open(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "create", "stall_timeout_ns", "stall_min_ns", NULL};
    const char *name;
    int create = 0;
    unsigned long long timeout = KI_RING_STALL_TIMEOUT_NS, min = KI_RING_STALL_MIN_NS;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|pKK:open", kwlist, &name, &create, &timeout, &min)) return NULL;
    ConsumerObject *self = (ConsumerObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    if (pthread_mutex_init(&self->lock, NULL) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->lock_ready = 1;
    char err[256];
    int rc = ki_ring_consumer_open(&self->c, name, create ? KI_RING_CREATE : 0, err, sizeof err);
    if (rc < 0) {
        Py_DECREF(self);
        return raise_ring_error(rc, err);
    }
    self->c.stall_timeout_ns = timeout;
    self->c.stall_min_ns = min;
    return (PyObject *)self;
}

static void consumer_lock(ConsumerObject *self) {
    if (self->lock_ready) pthread_mutex_lock(&self->lock);
}

static void consumer_unlock(ConsumerObject *self) {
    if (self->lock_ready) pthread_mutex_unlock(&self->lock);
}

/* Unmap once no other thread is inside a read (it waits for one in progress). */
static void consumer_close(ConsumerObject *self) {
    consumer_lock(self);
    ki_ring_consumer_close(&self->c);
    consumer_unlock(self);
}

static void Consumer_dealloc(ConsumerObject *self) {
    consumer_close(self);
    if (self->lock_ready) pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Consumer_close(ConsumerObject *self, PyObject *unused) {
    (void)unused;
    consumer_close(self);
    Py_RETURN_NONE;
}

/* The GIL-free part of read_into/peek_into: -1 when the ring was closed meanwhile. */
static Py_ssize_t consumer_read(ConsumerObject *self, Py_buffer *b, int keep) {
    size_t max = (size_t)b->len / sizeof(struct ki_record);
    Py_ssize_t n = -1;
    Py_BEGIN_ALLOW_THREADS consumer_lock(self);
    if (self->c.ring.hdr != NULL) {
        struct ki_record *out = (struct ki_record *)b->buf;
        n = (Py_ssize_t)(keep ? ki_ring_peek(&self->c, out, max, ki_ring_mono_ns())
                              : ki_ring_consume(&self->c, out, max, ki_ring_mono_ns()));
    }
    consumer_unlock(self);
    Py_END_ALLOW_THREADS return n;
}

static PyObject *consumer_read_call(ConsumerObject *self, PyObject *arg, int keep) {
    if (check_open(&self->c.ring) < 0) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t n = consumer_read(self, &b, keep);
    PyBuffer_Release(&b);
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "ring is closed");
        return NULL;
    }
    return PyLong_FromSsize_t(n);
}

/* read_into(buffer) -> n: fill a writable buffer with whole 64-byte records. */
static PyObject *Consumer_read_into(ConsumerObject *self, PyObject *arg) { return consumer_read_call(self, arg, 0); }

/* peek_into(buffer) -> n: like read_into, but the slots stay taken until commit(). */
static PyObject *Consumer_peek_into(ConsumerObject *self, PyObject *arg) { return consumer_read_call(self, arg, 1); }

static PyObject *Consumer_commit(ConsumerObject *self, PyObject *unused) {
    (void)unused;
    if (check_open(&self->c.ring) < 0) return NULL;
    consumer_lock(self); /* close() needs the GIL we hold: only a read in progress can be inside */
    ki_ring_commit(&self->c);
    consumer_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *Consumer_stats(ConsumerObject *self, PyObject *unused) {
    (void)unused;
    if (check_open(&self->c.ring) < 0) return NULL;
    return header_stats(&self->c.ring);
}

static PyObject *Consumer_producer_stats(ConsumerObject *self, PyObject *arg) {
    if (check_open(&self->c.ring) < 0) return NULL;
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (id == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return producer_stats(&self->c.ring, id);
}

static PyObject *Consumer_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *Consumer_exit(ConsumerObject *self, PyObject *args) {
    (void)args;
    consumer_close(self);
    Py_RETURN_FALSE;
}

static PyObject *Consumer_get_capacity(ConsumerObject *self, void *c) {
    (void)c;
    if (check_open(&self->c.ring) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(self->c.ring.hdr->capacity);
}

static PyObject *Consumer_get_label(ConsumerObject *self, void *c) {
    (void)c;
    if (check_open(&self->c.ring) < 0) return NULL;
    return PyUnicode_FromStringAndSize(self->c.ring.hdr->label, (Py_ssize_t)strnlen(self->c.ring.hdr->label, 64));
}

static PyMethodDef Consumer_methods[] = {
    {"open", (PyCFunction)(void (*)(void))Consumer_open, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "open(name, create=False, stall_timeout_ns=250ms, stall_min_ns=2ms) -> Consumer"},
    {"close", (PyCFunction)Consumer_close, METH_NOARGS, "release the consumer claim and unmap"},
    {"read_into", (PyCFunction)Consumer_read_into, METH_O, "read_into(buffer) -> records copied"},
    {"peek_into", (PyCFunction)Consumer_peek_into, METH_O, "peek_into(buffer) -> records copied, slots kept"},
    {"commit", (PyCFunction)Consumer_commit, METH_NOARGS, "free every slot peeked so far"},
    {"stats", (PyCFunction)Consumer_stats, METH_NOARGS, "ring counters"},
    {"producer_stats", (PyCFunction)Consumer_producer_stats, METH_O, "producer_stats(id) -> dict or None"},
    {"__enter__", (PyCFunction)Consumer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Consumer_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Consumer_getset[] = {
    {"capacity", (getter)Consumer_get_capacity, NULL, "slots", NULL},
    {"label", (getter)Consumer_get_label, NULL, "GPU label", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ConsumerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kernel_insight.agent._ring.Consumer",
    .tp_basicsize = sizeof(ConsumerObject),
    .tp_dealloc = (destructor)Consumer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The single consumer of a ring; build with Consumer.open().",
    .tp_methods = Consumer_methods,
    .tp_getset = Consumer_getset,
};

/* ---- module ------------------------------------------------------------ */

static struct PyModuleDef ringmodule = {PyModuleDef_HEAD_INIT, "_ring", "Shared-memory ring binding (docs/ring.md).",
                                        -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ring(void) {
    if (PyType_Ready(&RingType) < 0 || PyType_Ready(&ConsumerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&ringmodule);
    if (!m) return NULL;
    RingError = PyErr_NewExceptionWithDoc("kernel_insight.agent._ring.RingError",
                                          "A ring could not be created, attached or read; args are (errno, message).",
                                          PyExc_OSError, NULL);
    if (!RingError || PyModule_AddObjectRef(m, "RingError", RingError) < 0 ||
        PyModule_AddObjectRef(m, "Ring", (PyObject *)&RingType) < 0 ||
        PyModule_AddObjectRef(m, "Consumer", (PyObject *)&ConsumerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "VERSION", KI_RING_VERSION);
    PyModule_AddIntConstant(m, "RECORD_SIZE", KI_RING_RECORD_SIZE);
    PyModule_AddIntConstant(m, "DEFAULT_CAPACITY", KI_RING_DEFAULT_CAPACITY);
    PyModule_AddIntConstant(m, "DROPPED", KI_RING_DROPPED);
    PyModule_AddIntConstant(m, "LOST", KI_RING_LOST);
    return m;
}
