/*
 * remote_write's new series in C: a TimeSeries' label fields parsed, made canonical, checked
 * against the series limits and fingerprinted exactly as collector/rows.py's canonical_labels,
 * validate_series and series_fingerprint do (series_labels.c).
 */
#ifndef KI_SERIES_LABELS_H
#define KI_SERIES_LABELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* series_labels(buf, spans, max_labels, max_name_bytes, max_value_bytes, utf8_names) -> list */
PyObject *ki_series_labels_parse(PyObject *self, PyObject *args);

#define KI_SPANS_PAIRS "spans must hold int64 (start, end) pairs"
#define KI_SPAN_OUTSIDE "span outside the buffer"

/* The number of tuples of `width` int64s (start, end, ...) in spans, or -1 with ValueError(bad_size). */
Py_ssize_t ki_spans_count(const Py_buffer *spans, Py_ssize_t width, const char *bad_size);

/* Tuple k's (start, end) of spans (tuples of `width` int64s) into se: 0, or -1 with ValueError(outside)
 * when buf[start:end] is not inside a buffer of buf_len bytes. */
int ki_span_at(const Py_buffer *spans, Py_ssize_t width, Py_ssize_t k, Py_ssize_t buf_len, const char *outside,
               int64_t se[2]);

#endif
