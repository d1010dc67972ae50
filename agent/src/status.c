/* status.c - the collector's HTTP status, classified once for every batch and the names batch. */
#include "ki_status.h"

#include "ki_transport.h"

enum ki_status_class ki_status_classify(int s) {
    if ((s >= 200 && s < 300) || s == 409) return KI_STATUS_STORED;
    if (s == 401 || s == 403) return KI_STATUS_AUTH;
    if (s == KI_STATUS_NAMES_UNKNOWN) return KI_STATUS_NAMES;
    if (s == 408 || s == 429 || s < 400 || s >= 500) return KI_STATUS_RETRY;
    return KI_STATUS_PERMANENT;
}
