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

#endif
