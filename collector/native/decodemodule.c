/*
 * kernel_insight.collector._decode - the collector's per-sample decoding loops, in C.
 *
 * Two loops that cost the collector most of its CPU per sample in Python:
 *
 * - varints(buf, n): exactly n canonical protobuf varints filling buf (the agent wire
 *   format's record columns, collector/wire.py);
 * - write_request(buf): Prometheus' usual encoding of a remote_write WriteRequest scanned
 *   in one pass (collector/remote_write.py): where each TimeSeries' label bytes are, and
 *   every sample's value and timestamp as columns.
 *
 * Both check what they read and never read past the buffer; a malformed input raises
 * ValueError with a message, and write_request returns None for an encoding its scan does
 * not handle (the Python general decoder then takes the request). Neither holds a
 * reference to the buffer after it returns; both run without the GIL while they scan.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* ---- varints ---------------------------------------------------------------------- */

/* 0, or a static message naming what is wrong. */
static const char *decode_varints(const uint8_t *buf, Py_ssize_t size, Py_ssize_t n, uint64_t *out)
{
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = 0;
        int k = 0;
        for (;;) {
            if (pos >= size)
                return "count";
            uint8_t b = buf[pos++];
            if (k == 9 && b > 1)
                return b >= 0x80 ? "long" : "overflow";
            v |= (uint64_t)(b & 0x7F) << (7 * k);
            if (b < 0x80) {
                if (k > 0 && b == 0)
                    return "noncanonical";
                break;
            }
            if (++k == 10)
                return "long";
        }
        out[i] = v;
    }
    return pos == size ? NULL : "count";
}

static PyObject *py_varints(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*n", &view, &n))
        return NULL;
    if (n < 0 || n > view.len) { /* each varint takes at least one byte */
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "expected %zd varints in %zd bytes", n, view.len);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint64_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = decode_varints(view.buf, view.len, n, (uint64_t *)PyBytes_AS_STRING(out));
    Py_END_ALLOW_THREADS
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (err == NULL)
        return out;
    Py_DECREF(out);
    if (strcmp(err, "count") == 0)
        return PyErr_Format(PyExc_ValueError, "expected %zd varints in %zd bytes", n, len);
    if (strcmp(err, "long") == 0)
        return PyErr_Format(PyExc_ValueError, "varint longer than 10 bytes");
    if (strcmp(err, "overflow") == 0)
        return PyErr_Format(PyExc_ValueError, "varint does not fit 64 bits");
    return PyErr_Format(PyExc_ValueError, "non-canonical varint");
}

/* ---- remote_write ----------------------------------------------------------------- */

enum scan { SCAN_OK = 0, SCAN_UNUSUAL = 1, SCAN_ERROR = 2, SCAN_NOMEM = 3 };

/* A varint length at buf[*pos] (< end); SCAN_ERROR when truncated or over 64 bits. */
static int read_len(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, uint64_t *value)
{
    uint64_t v = 0;
    for (int k = 0; k < 10; k++) {
        if (*pos >= end)
            return SCAN_ERROR;
        uint8_t b = buf[(*pos)++];
        if (k == 9 && b > 1)
            return SCAN_ERROR;
        v |= (uint64_t)(b & 0x7F) << (7 * k);
        if (b < 0x80) {
            *value = v;
            return SCAN_OK;
        }
    }
    return SCAN_ERROR;
}

struct columns {
    int64_t *series; /* (label start, label end, samples) per TimeSeries */
    double *values;
    uint64_t *ts;
    Py_ssize_t nseries, nsamples, cap_series, cap_samples;
};

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    Py_ssize_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = PyMem_RawRealloc(*p, (size_t)c * item);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/*
 * The scan of collector/remote_write.py's _decode_fast, sample for sample: TimeSeries
 * (field 1) only; in each, the labels (field 1) first, then samples (field 2) of at most
 * 127 bytes holding a double value (field 1, may be left out when zero) and then a varint
 * timestamp (field 2, may be left out). *msg names a malformation.
 */
static int scan_write_request(const uint8_t *buf, Py_ssize_t n, struct columns *c, const char **msg)
{
    Py_ssize_t pos = 0;
    while (pos < n) {
        if (buf[pos] != 0x0A)
            return SCAN_UNUSUAL;
        Py_ssize_t start = pos + 1;
        uint64_t length;
        if (read_len(buf, &start, n, &length) != SCAN_OK || length > (uint64_t)(n - start)) {
            *msg = "WriteRequest: field 1 runs past the end of its message";
            return SCAN_ERROR;
        }
        Py_ssize_t end = start + (Py_ssize_t)length;
        Py_ssize_t p = start;
        while (p < end && buf[p] == 0x0A) {
            Py_ssize_t q = p + 1;
            uint64_t size;
            if (read_len(buf, &q, end, &size) != SCAN_OK)
                return SCAN_UNUSUAL; /* the general decoder names the error */
            if (size > (uint64_t)(end - q))
                return SCAN_UNUSUAL;
            p = q + (Py_ssize_t)size;
        }
        Py_ssize_t labels_end = p;
        Py_ssize_t first = c->nsamples;
        while (p < end) {
            if (buf[p] != 0x12 || p + 1 >= end || buf[p + 1] >= 0x80)
                return SCAN_UNUSUAL;
            Py_ssize_t s = p + 2, e = s + buf[p + 1];
            if (e > end)
                return SCAN_UNUSUAL;
            double value = 0.0;
            Py_ssize_t ts_start = -1;
            if (s == e) {
                /* an empty Sample: value 0, timestamp 0 */
            } else if (buf[s] == 0x09 && e - s >= 9) {
                memcpy(&value, buf + s + 1, 8); /* little-endian, as on every platform we build for */
                if (e - s > 9) {
                    if (buf[s + 9] != 0x10)
                        return SCAN_UNUSUAL;
                    ts_start = s + 10;
                }
            } else if (buf[s] == 0x10) {
                ts_start = s + 1;
            } else {
                return SCAN_UNUSUAL;
            }
            uint64_t ts = 0;
            if (ts_start >= 0) {
                Py_ssize_t len = e - ts_start;
                if (len < 1 || len > 10) {
                    *msg = "Sample: malformed timestamp varint";
                    return SCAN_ERROR;
                }
                for (Py_ssize_t k = 0; k < len; k++) {
                    uint8_t b = buf[ts_start + k];
                    if ((k < len - 1) != (b >= 0x80)) {
                        *msg = "Sample: malformed timestamp varint";
                        return SCAN_ERROR;
                    }
                    ts |= (uint64_t)(b & 0x7F) << (7 * k);
                }
            }
            if (c->nsamples == c->cap_samples) {
                Py_ssize_t cap_v = c->cap_samples, cap_t = c->cap_samples;
                if (grow((void **)&c->values, &cap_v, c->nsamples + 1, sizeof(double)) < 0 ||
                    grow((void **)&c->ts, &cap_t, c->nsamples + 1, sizeof(uint64_t)) < 0)
                    return SCAN_NOMEM;
                c->cap_samples = cap_v; /* both grew to the same capacity */
            }
            c->values[c->nsamples] = value;
            c->ts[c->nsamples] = ts;
            c->nsamples++;
            p = e;
        }
        if (grow((void **)&c->series, &c->cap_series, 3 * (c->nseries + 1), sizeof(int64_t)) < 0)
            return SCAN_NOMEM;
        c->series[3 * c->nseries] = start;
        c->series[3 * c->nseries + 1] = labels_end;
        c->series[3 * c->nseries + 2] = c->nsamples - first;
        c->nseries++;
        pos = end;
    }
    return SCAN_OK;
}

static PyObject *py_write_request(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    struct columns c = {0};
    const char *msg = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan_write_request(view.buf, view.len, &c, &msg);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (rc == SCAN_OK) {
        /* y# turns a NULL pointer into None: an empty request has empty columns, not none. */
        static const char empty[1] = {0};
        result = Py_BuildValue("(y#y#y#)", c.series ? (const char *)c.series : empty,
                               (Py_ssize_t)(c.nseries * 3 * sizeof(int64_t)),
                               c.values ? (const char *)c.values : empty, (Py_ssize_t)(c.nsamples * sizeof(double)),
                               c.ts ? (const char *)c.ts : empty, (Py_ssize_t)(c.nsamples * sizeof(uint64_t)));
    } else if (rc == SCAN_UNUSUAL) {
        result = Py_NewRef(Py_None);
    } else if (rc == SCAN_ERROR) {
        PyErr_SetString(PyExc_ValueError, msg);
    } else {
        PyErr_NoMemory();
    }
    PyMem_RawFree(c.series);
    PyMem_RawFree(c.values);
    PyMem_RawFree(c.ts);
    return result;
}

static PyMethodDef methods[] = {
    {"varints", py_varints, METH_VARARGS,
     "varints(buf, n) -> bytes: exactly n canonical varints filling buf, as little-endian uint64s."},
    {"write_request", py_write_request, METH_O,
     "write_request(buf) -> (series, values, ts) | None: a WriteRequest in Prometheus' usual encoding, "
     "as int64 (label start, label end, samples) triples per TimeSeries, float64 values and uint64 "
     "timestamps; None for an encoding the scan does not handle."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kernel_insight.collector._decode",
    "The collector's per-sample decoding loops in C (collector/native/decodemodule.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__decode(void)
{
    return PyModule_Create(&module);
}
