/*
 * kernel_insight.kql._windows - kql's sequential per-window loops (kql/functions/range.py), in C.
 *
 * Kahan sums (sum_over_time, avg_over_time), Welford variance (stddev/stdvar_over_time) and the
 * Kahan sums of a least-squares regression (deriv, predict_linear) are sequential in each
 * window; numpy runs them in lock step over all windows, one Python iteration of a dozen ufuncs
 * per sample (an instant stddev_over_time(x[15m]) of 200 series: ~840 numpy calls). Here each
 * window is one C loop doing the very same IEEE operations in the same order, so the results
 * are the same bits (tests/kql/test_kql_native_windows.py checks them against the numpy paths).
 * Build with -ffp-contract=off: a fused multiply-add would round differently.
 *
 * Also the Kahan sums of sum and avg by group (aggregation.py), row by row in order, and the
 * counts of present rows by group.
 *
 * Also searchsorted: where query times fall in every series' samples (window bounds), one walk
 * per series instead of numpy's passes over every sample.
 *
 * Also series_ranges: where wanted series' samples within a time window lie in one cached hour
 * (collector/sample_cache.py gather_series), two binary searches per series instead of a dozen
 * numpy passes over all of them.
 *
 * Also stamps_text: a range answer's step times as the Prometheus API writes them, one pass in C
 * (kql/values.py: a float formatter and a byte replace over the text cost more than the rest).
 *
 * The window functions take the windows as (lo, cnt) int64 arrays of equal length n into a float64
 * array of values, reads at most `limit` samples of each window (longer windows are finished
 * by the caller), writes its float64 (or bool) outputs into caller-made arrays, checks every
 * index against the buffers first, and runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The C port of kql/histogram/gomath.py kahan_inc_into, the one Kahan step of kql (Prometheus'
 * util/kahansum.Inc, formerly kahanSumInc in promql/functions.go): Knuth's TwoSum, which gives
 * Inc's Fast2Sum error without its branch wherever the sum is finite, the compensation reset
 * to 0 where the sum turns infinite. tests/kql/test_kql_numerics.py checks kahan() and
 * group_kahan() against gomath.kahan_inc bit for bit (cancellations, NaN, infinities). */
static inline void kahan_step(double *sum, double *comp, double inc)
{
    double t = *sum + inc;
    double bb = t - *sum;
    double x = inc - bb;
    bb = t - bb;
    bb = *sum - bb;
    bb = bb + x;
    *comp = *comp + bb;
    if (isinf(t))
        *comp = 0.0;
    *sum = t;
}

typedef struct {
    Py_buffer b;
    int held;
} buf_t;

static int get(PyObject *obj, buf_t *out, int writable, Py_ssize_t itemsize, const char *name)
{
    if (PyObject_GetBuffer(obj, &out->b, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    out->held = 1;
    if (out->b.len % itemsize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: not an array of %zd-byte items", name, itemsize);
        return -1;
    }
    return 0;
}

static void release(buf_t *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].b);
}

/* The windows' (lo, cnt) checked against n values: 0, or -1 with ValueError set. */
static int check_windows(const int64_t *lo, const int64_t *cnt, Py_ssize_t n, Py_ssize_t values, int64_t limit)
{
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "limit must be >= 0");
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t m = cnt[j] < limit ? cnt[j] : limit;
        if (lo[j] < 0 || cnt[j] < 0 || (m > 0 && lo[j] > (int64_t)values - m)) {
            PyErr_Format(PyExc_ValueError, "window %zd (lo %lld, count %lld) outside %zd values", j,
                         (long long)lo[j], (long long)cnt[j], values);
            return -1;
        }
    }
    return 0;
}

/* n + 1 series offsets into `values` values checked: within them and non-decreasing. 0, or -1 with
 * ValueError set. */
static int check_offsets(const int64_t *offsets, Py_ssize_t n, Py_ssize_t values)
{
    for (Py_ssize_t i = 0; i <= n; i++) {
        if (offsets[i] < 0 || offsets[i] > (int64_t)values || (i > 0 && offsets[i] < offsets[i - 1])) {
            PyErr_Format(PyExc_ValueError, "offset %zd (%lld) outside 0..%zd or decreasing", i,
                         (long long)offsets[i], values);
            return -1;
        }
    }
    return 0;
}

/* kahan(vs, lo, cnt, limit, total, comp): Kahan sum and compensation of each window. */
static PyObject *py_kahan(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[6];
    long long limit;
    buf_t b[6] = {0};
    if (!PyArg_ParseTuple(args, "OOOLOO:kahan", &o[0], &o[1], &o[2], &limit, &o[4], &o[5]))
        return NULL;
    if (get(o[0], &b[0], 0, 8, "vs") < 0 || get(o[1], &b[1], 0, 8, "lo") < 0 || get(o[2], &b[2], 0, 8, "cnt") < 0 ||
        get(o[4], &b[4], 1, 8, "total") < 0 || get(o[5], &b[5], 1, 8, "comp") < 0)
        goto fail;
    Py_ssize_t n = b[1].b.len / 8;
    if (b[2].b.len / 8 != n || b[4].b.len / 8 != n || b[5].b.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "lo, cnt, total and comp must have the same length");
        goto fail;
    }
    const double *vs = b[0].b.buf;
    const int64_t *lo = b[1].b.buf, *cnt = b[2].b.buf;
    double *total = b[4].b.buf, *comp = b[5].b.buf;
    if (check_windows(lo, cnt, n, b[0].b.len / 8, limit) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t m = cnt[j] < limit ? cnt[j] : limit;
        const double *v = vs + lo[j];
        double s = 0.0, c = 0.0;
        for (int64_t k = 0; k < m; k++)
            kahan_step(&s, &c, v[k]);
        total[j] = s;
        comp[j] = c;
    }
    Py_END_ALLOW_THREADS
    release(b, 6);
    Py_RETURN_NONE;
fail:
    release(b, 6);
    return NULL;
}

/* variance(vs, lo, cnt, limit, out): Welford's population variance of each window, the mean and
 * the sum of squares Kahan-compensated (range.py _variance), divided by the whole count. */
static PyObject *py_variance(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[5];
    long long limit;
    buf_t b[5] = {0};
    if (!PyArg_ParseTuple(args, "OOOLO:variance", &o[0], &o[1], &o[2], &limit, &o[4]))
        return NULL;
    if (get(o[0], &b[0], 0, 8, "vs") < 0 || get(o[1], &b[1], 0, 8, "lo") < 0 || get(o[2], &b[2], 0, 8, "cnt") < 0 ||
        get(o[4], &b[4], 1, 8, "out") < 0)
        goto fail;
    Py_ssize_t n = b[1].b.len / 8;
    if (b[2].b.len / 8 != n || b[4].b.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "lo, cnt and out must have the same length");
        goto fail;
    }
    const double *vs = b[0].b.buf;
    const int64_t *lo = b[1].b.buf, *cnt = b[2].b.buf;
    double *out = b[4].b.buf;
    if (check_windows(lo, cnt, n, b[0].b.len / 8, limit) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t m = cnt[j] < limit ? cnt[j] : limit;
        const double *v = vs + lo[j];
        double mean = 0.0, c_mean = 0.0, aux = 0.0, c_aux = 0.0;
        for (int64_t k = 0; k < m; k++) {
            double f = v[k];
            double delta = f - (mean + c_mean);
            kahan_step(&mean, &c_mean, delta / ((double)k + 1.0));
            double x = f - (mean + c_mean);
            kahan_step(&aux, &c_aux, delta * x);
        }
        out[j] = (aux + c_aux) / (double)(cnt[j] > 1 ? cnt[j] : 1);
    }
    Py_END_ALLOW_THREADS
    release(b, 5);
    Py_RETURN_NONE;
fail:
    release(b, 5);
    return NULL;
}

/* regression(vs, ts, lo, cnt, t0, limit, total, comp, first_y, const_y): the Kahan sums of x, y,
 * xy and x2 of each window (x = (ts - t0) / 1000 s; total and comp are 4 x n, row by row), its
 * first y, and whether every later y equals it (range.py _regression). */
static PyObject *py_regression(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[10];
    long long limit;
    buf_t b[10] = {0};
    if (!PyArg_ParseTuple(args, "OOOOOLOOOO:regression", &o[0], &o[1], &o[2], &o[3], &o[4], &limit, &o[6], &o[7],
                          &o[8], &o[9]))
        return NULL;
    if (get(o[0], &b[0], 0, 8, "vs") < 0 || get(o[1], &b[1], 0, 8, "ts") < 0 || get(o[2], &b[2], 0, 8, "lo") < 0 ||
        get(o[3], &b[3], 0, 8, "cnt") < 0 || get(o[4], &b[4], 0, 8, "t0") < 0 || get(o[6], &b[6], 1, 8, "total") < 0 ||
        get(o[7], &b[7], 1, 8, "comp") < 0 || get(o[8], &b[8], 1, 8, "first_y") < 0 ||
        get(o[9], &b[9], 1, 1, "const_y") < 0)
        goto fail;
    Py_ssize_t n = b[2].b.len / 8;
    if (b[1].b.len != b[0].b.len || b[3].b.len / 8 != n || b[4].b.len / 8 != n || b[6].b.len / 8 != 4 * n ||
        b[7].b.len / 8 != 4 * n || b[8].b.len / 8 != n || b[9].b.len != n) {
        PyErr_SetString(PyExc_ValueError,
                        "ts must match vs; cnt, t0, first_y and const_y must match lo; total and comp be 4 x n");
        goto fail;
    }
    const double *vs = b[0].b.buf;
    const int64_t *ts = b[1].b.buf, *lo = b[2].b.buf, *cnt = b[3].b.buf, *t0 = b[4].b.buf;
    double *total = b[6].b.buf, *comp = b[7].b.buf, *first_y = b[8].b.buf;
    uint8_t *const_y = b[9].b.buf;
    if (check_windows(lo, cnt, n, b[0].b.len / 8, limit) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t m = cnt[j] < limit ? cnt[j] : limit;
        double s[4] = {0.0, 0.0, 0.0, 0.0}, c[4] = {0.0, 0.0, 0.0, 0.0};
        double first = 0.0;
        uint8_t same = 1;
        for (int64_t k = 0; k < m; k++) {
            int64_t i = lo[j] + k;
            double y = vs[i];
            double x = (double)(ts[i] - t0[j]) / 1000.0;
            if (k == 0)
                first = y;
            else if (!(y == first))
                same = 0;
            kahan_step(&s[0], &c[0], x);
            kahan_step(&s[1], &c[1], y);
            kahan_step(&s[2], &c[2], x * y);
            kahan_step(&s[3], &c[3], x * x);
        }
        for (int r = 0; r < 4; r++) {
            total[r * n + j] = s[r];
            comp[r * n + j] = c[r];
        }
        first_y[j] = first;
        const_y[j] = same;
    }
    Py_END_ALLOW_THREADS
    release(b, 10);
    Py_RETURN_NONE;
fail:
    release(b, 10);
    return NULL;
}

/* searchsorted(ts, offsets, queries, right, out): for every series i (ts[offsets[i]:offsets[i+1]],
 * ascending) and every query k (queries ascending), the global index numpy's searchsorted gives in
 * that slice (side "right" when right, else "left"), into out[i * len(queries) + k]. One walk
 * through each series' samples and the queries together (engine.py batched_searchsorted). */
static PyObject *py_searchsorted(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[5];
    int right;
    buf_t b[5] = {0};
    if (!PyArg_ParseTuple(args, "OOOpO:searchsorted", &o[0], &o[1], &o[2], &right, &o[4]))
        return NULL;
    if (get(o[0], &b[0], 0, 8, "ts") < 0 || get(o[1], &b[1], 0, 8, "offsets") < 0 ||
        get(o[2], &b[2], 0, 8, "queries") < 0 || get(o[4], &b[4], 1, 8, "out") < 0)
        goto fail;
    const int64_t *ts = b[0].b.buf, *offsets = b[1].b.buf, *queries = b[2].b.buf;
    int64_t *out = b[4].b.buf;
    Py_ssize_t values = b[0].b.len / 8, n = b[1].b.len / 8 - 1, q = b[2].b.len / 8;
    if (n < 0 || b[4].b.len / 8 != n * q) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold n + 1 positions and out n x len(queries)");
        goto fail;
    }
    if (check_offsets(offsets, n, values) < 0)
        goto fail;
    for (Py_ssize_t k = 1; k < q; k++) {
        if (queries[k] < queries[k - 1]) {
            PyErr_SetString(PyExc_ValueError, "queries must be ascending");
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = offsets[i], hi = offsets[i + 1];
        int64_t *row = out + i * q;
        for (Py_ssize_t k = 0; k < q; k++) {
            int64_t t = queries[k];
            if (right)
                while (p < hi && ts[p] <= t)
                    p++;
            else
                while (p < hi && ts[p] < t)
                    p++;
            row[k] = p;
        }
    }
    Py_END_ALLOW_THREADS
    release(b, 5);
    Py_RETURN_NONE;
fail:
    release(b, 5);
    return NULL;
}

/* group_kahan(values, present, gid, total, comp, count): the Kahan sum, compensation and count of
 * the present values of every group and step (aggregation.py _kahan_totals). values and present
 * are n x steps, gid holds each row's group (0 <= gid < groups), total, comp and count are
 * groups x steps and start at zero. Rows are added strictly in row order, value by value, as
 * Prometheus' sum and avg add the series of a group. With values, total and comp None it only
 * counts (aggregation.py _group_counts). */
static PyObject *py_group_kahan(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[6];
    buf_t b[6] = {0};
    if (!PyArg_ParseTuple(args, "OOOOOO:group_kahan", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5]))
        return NULL;
    int sums = o[0] != Py_None;
    if (sums != (o[3] != Py_None) || sums != (o[4] != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "values, total and comp: all three or none");
        return NULL;
    }
    if ((sums && (get(o[0], &b[0], 0, 8, "values") < 0 || get(o[3], &b[3], 1, 8, "total") < 0 ||
                  get(o[4], &b[4], 1, 8, "comp") < 0)) ||
        get(o[1], &b[1], 0, 1, "present") < 0 || get(o[2], &b[2], 0, 8, "gid") < 0 || get(o[5], &b[5], 1, 8, "count") < 0)
        goto fail;
    Py_ssize_t n = b[2].b.len / 8, cells = b[1].b.len, out = b[5].b.len / 8;
    Py_ssize_t steps = n > 0 ? cells / n : 0;
    if ((sums && (b[0].b.len / 8 != cells || b[3].b.len / 8 != out || b[4].b.len / 8 != out)) ||
        (n > 0 && cells % n != 0) || (n == 0 && cells != 0) || (steps > 0 && out % steps != 0)) {
        PyErr_SetString(PyExc_ValueError, "values and present must be n x steps, total, comp and count groups x steps");
        goto fail;
    }
    const double *values = b[0].b.buf;
    const uint8_t *present = b[1].b.buf;
    const int64_t *gid = b[2].b.buf;
    double *total = b[3].b.buf, *comp = b[4].b.buf;
    int64_t *count = b[5].b.buf;
    int64_t groups = steps > 0 ? (int64_t)(out / steps) : 0;
    for (Py_ssize_t i = 0; i < n && steps > 0; i++) {
        if (gid[i] < 0 || gid[i] >= groups) {
            PyErr_Format(PyExc_ValueError, "row %zd: group %lld outside 0..%lld", i, (long long)gid[i],
                         (long long)groups - 1);
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *p = present + i * steps;
        Py_ssize_t g = (Py_ssize_t)gid[i] * steps;
        if (!sums) {
            for (Py_ssize_t j = 0; j < steps; j++)
                count[g + j] += p[j] != 0;
            continue;
        }
        const double *v = values + i * steps;
        for (Py_ssize_t j = 0; j < steps; j++) {
            if (p[j]) {
                kahan_step(&total[g + j], &comp[g + j], v[j]);
                count[g + j]++;
            }
        }
    }
    Py_END_ALLOW_THREADS
    release(b, 6);
    Py_RETURN_NONE;
fail:
    release(b, 6);
    return NULL;
}

/* The first index in [l, h) of ascending ts whose time is >= t, else h. */
static inline int64_t first_at_least(const int64_t *ts, int64_t l, int64_t h, int64_t t)
{
    while (l < h) {
        int64_t mid = l + (h - l) / 2;
        if (ts[mid] < t)
            l = mid + 1;
        else
            h = mid;
    }
    return l;
}

/* series_ranges(fps, offsets, ts, want, start, end, starts, lengths): for every wanted fingerprint
 * want[i], its samples with start <= t <= end in a block where series fps[j] (ascending, unique)
 * owns ts[offsets[j]:offsets[j+1]] (ascending): the first one's index into starts[i] and their
 * count into lengths[i] (0 and 0 for a series not in the block). */
static PyObject *py_series_ranges(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[8];
    long long start, end;
    buf_t b[8] = {0};
    if (!PyArg_ParseTuple(args, "OOOOLLOO:series_ranges", &o[0], &o[1], &o[2], &o[3], &start, &end, &o[6],
                          &o[7]))
        return NULL;
    if (get(o[0], &b[0], 0, 8, "fps") < 0 || get(o[1], &b[1], 0, 8, "offsets") < 0 ||
        get(o[2], &b[2], 0, 8, "ts") < 0 || get(o[3], &b[3], 0, 8, "want") < 0 ||
        get(o[6], &b[6], 1, 8, "starts") < 0 || get(o[7], &b[7], 1, 8, "lengths") < 0)
        goto fail;
    const uint64_t *fps = b[0].b.buf, *want = b[3].b.buf;
    const int64_t *offsets = b[1].b.buf, *ts = b[2].b.buf;
    int64_t *starts = b[6].b.buf, *lengths = b[7].b.buf;
    Py_ssize_t nf = b[0].b.len / 8, values = b[2].b.len / 8, n = b[3].b.len / 8;
    if (b[1].b.len / 8 != nf + 1 || b[6].b.len / 8 != n || b[7].b.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold len(fps) + 1 positions, starts and lengths len(want)");
        goto fail;
    }
    if (check_offsets(offsets, nf, values) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t fp = want[i];
        Py_ssize_t lo = 0, hi = nf;
        while (lo < hi) { /* first fps >= fp */
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (fps[mid] < fp)
                lo = mid + 1;
            else
                hi = mid;
        }
        starts[i] = 0;
        lengths[i] = 0;
        if (lo == nf || fps[lo] != fp)
            continue;
        int64_t first = first_at_least(ts, offsets[lo], offsets[lo + 1], start);
        starts[i] = first;
        int64_t past = end == INT64_MAX ? offsets[lo + 1] : first_at_least(ts, first, offsets[lo + 1], (int64_t)end + 1);
        lengths[i] = past - first;
    }
    Py_END_ALLOW_THREADS
    release(b, 8);
    Py_RETURN_NONE;
fail:
    release(b, 8);
    return NULL;
}

/* Largest time stamps_text writes (exclusive): 10**15 ms, seconds of at most 12 digits. */
#define STAMP_MAX_MS 1000000000000000LL

/* stamps_text(ms, after): every time of ms (int64 milliseconds in [0, 10**15)) in seconds, each
 * followed by the bytes after: whole seconds as an integer ("1796000000"), others with the one to
 * three decimals of their milliseconds, no trailing zero ("1796000000.5", "1796000000.025").
 * That is the text Python's repr and orjson give ms / 1000 below 10**15 ms: the quotient is the
 * double nearest the decimal, which has at most 15 significant digits, so no shorter decimal
 * names the same double (kql/values.py _ts; tests/kql/test_kql_json.py checks it against them). */
static PyObject *py_stamps_text(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o;
    const char *after;
    Py_ssize_t after_len;
    buf_t b[1] = {0};
    if (!PyArg_ParseTuple(args, "Oy#:stamps_text", &o, &after, &after_len))
        return NULL;
    if (get(o, &b[0], 0, 8, "ms") < 0) {
        release(b, 1);
        return NULL;
    }
    const int64_t *ms = b[0].b.buf;
    Py_ssize_t n = b[0].b.len / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ms[i] < 0 || ms[i] >= STAMP_MAX_MS) {
            PyErr_SetString(PyExc_ValueError, "stamps_text: a time outside [0, 10**15) ms");
            release(b, 1);
            return NULL;
        }
    }
    Py_ssize_t per = 16 + after_len; /* 12 digits, '.', 3 decimals */
    if (n > PY_SSIZE_T_MAX / per) {
        release(b, 1);
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * per);
    if (out == NULL) {
        release(b, 1);
        return NULL;
    }
    char *start = PyBytes_AS_STRING(out), *p = start;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t sec = ms[i] / 1000;
        int frac = (int)(ms[i] % 1000);
        char digits[16];
        int k = 0;
        do {
            digits[k++] = (char)('0' + sec % 10);
            sec /= 10;
        } while (sec);
        while (k)
            *p++ = digits[--k];
        if (frac) {
            *p++ = '.';
            *p++ = (char)('0' + frac / 100);
            if (frac % 100) {
                *p++ = (char)('0' + frac / 10 % 10);
                if (frac % 10)
                    *p++ = (char)('0' + frac % 10);
            }
        }
        memcpy(p, after, (size_t)after_len);
        p += after_len;
    }
    release(b, 1);
    if (_PyBytes_Resize(&out, p - start) < 0)
        return NULL;
    return out;
}

static PyMethodDef methods[] = {
    {"kahan", py_kahan, METH_VARARGS,
     "kahan(vs, lo, cnt, limit, total, comp): Kahan sum and compensation of each window's first "
     "min(cnt, limit) values, into total and comp."},
    {"variance", py_variance, METH_VARARGS,
     "variance(vs, lo, cnt, limit, out): Welford population variance of each window (Kahan-compensated), "
     "divided by max(cnt, 1), into out."},
    {"regression", py_regression, METH_VARARGS,
     "regression(vs, ts, lo, cnt, t0, limit, total, comp, first_y, const_y): Kahan sums of x, y, xy, x2 "
     "(x in seconds from t0) of each window, its first y and whether all its y equal it."},
    {"group_kahan", py_group_kahan, METH_VARARGS,
     "group_kahan(values, present, gid, total, comp, count): Kahan sum, compensation and count of the present "
     "values (n x steps) of every group (gid per row) and step, rows in order, into total, comp and count; "
     "with values, total and comp None the counts alone."},
    {"searchsorted", py_searchsorted, METH_VARARGS,
     "searchsorted(ts, offsets, queries, right, out): numpy's searchsorted of the ascending queries "
     "within every series' ascending slice of ts, as global indices, into out (n x len(queries))."},
    {"series_ranges", py_series_ranges, METH_VARARGS,
     "series_ranges(fps, offsets, ts, want, start, end, starts, lengths): where each wanted series' samples "
     "with start <= t <= end lie in a block (series fps[j] owns ts[offsets[j]:offsets[j+1]]): first index "
     "and count, into starts and lengths (0, 0 when absent)."},
    {"stamps_text", py_stamps_text, METH_VARARGS,
     "stamps_text(ms, after): every time of ms (int64 ms in [0, 10**15)) in seconds as the Prometheus API "
     "writes it (whole seconds as integers, else up to three decimals without trailing zeros), each "
     "followed by after, as one bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kernel_insight.kql._windows",
    "kql's sequential per-window loops in C (kql/native/windowsmodule.c).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__windows(void)
{
    return PyModule_Create(&module);
}
