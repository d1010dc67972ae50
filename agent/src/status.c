/* status.c - the collector's answer, classified once for every batch, the names batch and requests of several. */
#include "ki_status.h"

enum ki_status_class ki_status_classify(int s) {
    if ((s >= 200 && s < 300) || s == 409) return KI_STATUS_STORED;
    if (s == 401 || s == 403) return KI_STATUS_AUTH;
    if (s == KI_STATUS_NAMES_UNKNOWN) return KI_STATUS_NAMES;
    if (s == 408 || s == 429 || s < 400 || s >= 500) return KI_STATUS_RETRY;
    return KI_STATUS_PERMANENT;
}

enum ki_status_answer ki_status_answer(int rc, const struct ki_http_result *res, int n) {
    if (rc < 0) return KI_ANSWER_NONE;
    if (n <= 1 || res->nframes == n) return KI_ANSWER_EACH;
    int s = res->status;
    enum ki_status_class c = ki_status_classify(s);
    /* A collector that does not take several batches per request (docs/wire.md): one per request. */
    if (res->nframes == -1 && s >= 400 && c != KI_STATUS_AUTH && c != KI_STATUS_RETRY) return KI_ANSWER_SINGLE;
    if (res->nframes != -1 || (s >= 200 && s < 300)) return KI_ANSWER_UNSPLIT;
    return KI_ANSWER_EACH; /* 401/403, 408/429/5xx, 1xx/3xx for the whole request: every batch alike */
}

int ki_status_of(const struct ki_http_result *res, int n, int i) {
    return n > 1 && res->nframes == n ? res->frame_status[i] : res->status;
}
