/* Unit test: the HTTP status classifier (status.c). */
#include <stdio.h>

#include "ki_status.h"
#include "ki_test.h"

int main(void) {
    static const int stored[] = {200, 201, 204, 299, 409};
    static const int auth[] = {401, 403};
    static const int retry[] = {408, 429, 500, 502, 503, 504, 599, 301, 302, 100, 0, -1};
    static const int permanent[] = {400, 404, 405, 411, 413, 415, 422, 499};
    for (size_t i = 0; i < sizeof stored / sizeof *stored; i++) CHECK_EQ(ki_status_classify(stored[i]), KI_STATUS_STORED);
    for (size_t i = 0; i < sizeof auth / sizeof *auth; i++) CHECK_EQ(ki_status_classify(auth[i]), KI_STATUS_AUTH);
    for (size_t i = 0; i < sizeof retry / sizeof *retry; i++) CHECK_EQ(ki_status_classify(retry[i]), KI_STATUS_RETRY);
    for (size_t i = 0; i < sizeof permanent / sizeof *permanent; i++)
        CHECK_EQ(ki_status_classify(permanent[i]), KI_STATUS_PERMANENT);
    CHECK_EQ(ki_status_classify(424), KI_STATUS_NAMES);
    /* Every status falls in exactly one class, and every 4xx but the four named is permanent. */
    for (int s = 400; s < 500; s++) {
        enum ki_status_class c = ki_status_classify(s);
        int named = s == 401 || s == 403 || s == 408 || s == 409 || s == 424 || s == 429;
        CHECK(named || c == KI_STATUS_PERMANENT);
    }
    printf("ok\n");
    return 0;
}
