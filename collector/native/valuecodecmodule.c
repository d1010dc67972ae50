/* Sample values as decimal mantissa and scale, the loop of collector/valuecodec.py in C.
 *
 * encode(values, series_idx, top, float_out, mantissa_out, scale_out) fills the three output
 * buffers exactly as valuecodec._encode_numpy does (tests/collector/test_value_codec.py compares
 * them on random and awkward values): per value the smallest scale k of 0, 3, 6, 9, 12, 15 with
 * (double)m / 10^k bit-equal to it (|m| <= 2^53 at k = 0, < 10^14 above), each series raised to
 * its largest scale where the mantissa still fits, and a last check that every decimal decodes
 * to its value's bits. numpy needed six passes of a dozen array operations and a fixed cost a
 * call; this is one pass (make bench-samplestore, bench/results/samplestore.md). Plain IEEE double arithmetic (no -ffast-math, C11's
 * default of no contraction), so the results are numpy's bit for bit. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KI_FLOAT_FORM (-1)
#define KI_INT_LIMIT 9007199254740992.0 /* 2^53 */
#define KI_FRACTION_LIMIT 1e14

static const double POW10[16] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7,
                                 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
static const int64_t POW10_INT[16] = {1LL,
                                      10LL,
                                      100LL,
                                      1000LL,
                                      10000LL,
                                      100000LL,
                                      1000000LL,
                                      10000000LL,
                                      100000000LL,
                                      1000000000LL,
                                      10000000000LL,
                                      100000000000LL,
                                      1000000000000LL,
                                      10000000000000LL,
                                      100000000000000LL,
                                      1000000000000000LL};

static uint64_t bits_of(double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

/* The smallest scale of 0, 3, ..., 15 at which v is m / 10^k exactly; KI_FLOAT_FORM if none. */
static int smallest_scale(double v, int64_t *mant) {
    if (!(fabs(v) <= KI_INT_LIMIT)) /* NaN, infinities, past 2^53 */
        return KI_FLOAT_FORM;
    uint64_t want = bits_of(v);
    for (int k = 0; k <= 15; k += 3) {
        double scaled = v * POW10[k];
        if (k == 0 ? !(fabs(scaled) <= KI_INT_LIMIT) : !(fabs(scaled) < KI_FRACTION_LIMIT))
            return KI_FLOAT_FORM; /* a larger scale only grows it */
        int64_t m = (int64_t)nearbyint(scaled);
        if (bits_of((double)m / POW10[k]) == want) {
            *mant = m;
            return k;
        }
    }
    return KI_FLOAT_FORM;
}

static int writable(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd items of %zd bytes", what, n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *py_encode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer values, idx = {0}, top = {0}, fout, mout, sout;
    PyObject *idx_obj, *top_obj, *f_obj, *m_obj, *s_obj;
    if (!PyArg_ParseTuple(args, "y*OOOOO", &values, &idx_obj, &top_obj, &f_obj, &m_obj, &s_obj))
        return NULL;
    PyObject *result = NULL;
    int have_f = 0, have_m = 0, have_s = 0, have_idx = 0, have_top = 0;
    if (values.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "values must be float64s");
        goto done;
    }
    Py_ssize_t n = values.len / 8;
    if (writable(f_obj, &fout, 8, n, "float_out") < 0)
        goto done;
    have_f = 1;
    if (writable(m_obj, &mout, 8, n, "mantissa_out") < 0)
        goto done;
    have_m = 1;
    if (writable(s_obj, &sout, 1, n, "scale_out") < 0)
        goto done;
    have_s = 1;
    const int32_t *groups = NULL;
    int8_t *tops = NULL;
    Py_ssize_t n_top = 0;
    if (idx_obj != Py_None) {
        if (PyObject_GetBuffer(idx_obj, &idx, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_idx = 1;
        if (idx.len != n * 4) {
            PyErr_SetString(PyExc_ValueError, "series_idx must hold one int32 per value");
            goto done;
        }
        if (PyObject_GetBuffer(top_obj, &top, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_top = 1;
        groups = (const int32_t *)idx.buf;
        tops = (int8_t *)top.buf;
        n_top = top.len;
    }
    const double *v = (const double *)values.buf;
    double *f = (double *)fout.buf;
    int64_t *m = (int64_t *)mout.buf;
    int8_t *s = (int8_t *)sout.buf;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t mant = 0;
        int k = smallest_scale(v[i], &mant);
        s[i] = (int8_t)k;
        m[i] = mant;
    }
    if (groups != NULL) {
        int bad = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t g = groups[i];
            if (g < 0 || g >= n_top) {
                bad = 1;
                break;
            }
            if (s[i] > tops[g])
                tops[g] = s[i];
        }
        if (!bad) {
            for (Py_ssize_t i = 0; i < n; i++) {
                int want = tops[groups[i]];
                if (s[i] < 0 || want <= s[i])
                    continue;
                int step = want - s[i];
                if (!(fabs((double)m[i]) * POW10[step] < KI_FRACTION_LIMIT))
                    continue;
                int64_t raised = m[i] * POW10_INT[step];
                if (raised >= (int64_t)KI_FRACTION_LIMIT || raised <= -(int64_t)KI_FRACTION_LIMIT)
                    continue;
                m[i] = raised;
                s[i] = (int8_t)want;
            }
        } else {
            n = -1; /* reported below, with the GIL */
        }
    }
    if (n >= 0) {
        for (Py_ssize_t i = 0; i < n; i++) { /* the guard, then the float column */
            if (s[i] >= 0 && bits_of((double)m[i] / POW10[s[i]]) != bits_of(v[i])) {
                s[i] = KI_FLOAT_FORM;
                m[i] = 0;
            }
            f[i] = s[i] < 0 ? v[i] : 0.0;
        }
    }
    Py_END_ALLOW_THREADS;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "series_idx points outside top");
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&values);
    if (have_idx)
        PyBuffer_Release(&idx);
    if (have_top)
        PyBuffer_Release(&top);
    if (have_f)
        PyBuffer_Release(&fout);
    if (have_m)
        PyBuffer_Release(&mout);
    if (have_s)
        PyBuffer_Release(&sout);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(values, series_idx, top, float_out, mantissa_out, scale_out) -> None: values (float64) "
     "as decimals where exact; series_idx (int32 per value) or None; top (int8 per series, filled "
     "with -1) its scratch; the outputs float64, int64 and int8 per value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kernel_insight.collector._valuecodec",
    "Sample values as decimal mantissa and scale (collector/valuecodec.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__valuecodec(void) { return PyModule_Create(&module); }
