/* Unit test: the collector-answer classifier (status.c): each batch's status, and a request's answer as a whole. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ki_status.h"
#include "ki_test.h"

static struct ki_http_result answer(int status, int nframes, const int *frame_status) {
    struct ki_http_result r;
    memset(&r, 0, sizeof r);
    r.status = status;
    r.retry_after = -1;
    r.nframes = nframes;
    for (int i = 0; i < nframes; i++) r.frame_status[i] = (uint16_t)frame_status[i];
    return r;
}

/* A request's answer as a whole (docs/wire.md, "Several frames"), and each batch's status in it. */
static void answers(void) {
    static const int each[] = {200, 409, 503, 400, 424, 401};
    struct ki_http_result r = answer(200, 6, each);
    /* No answer at all (connection refused, reset, timed out): every batch is retried. */
    CHECK_EQ(ki_status_answer(-ECONNREFUSED, NULL, 1), KI_ANSWER_NONE);
    CHECK_EQ(ki_status_answer(-ETIMEDOUT, NULL, 6), KI_ANSWER_NONE);
    /* One status per batch: each settles by its own; the statuses classify as above. */
    CHECK_EQ(ki_status_answer(0, &r, 6), KI_ANSWER_EACH);
    for (int i = 0; i < 6; i++) CHECK_EQ(ki_status_of(&r, 6, i), each[i]);
    CHECK_EQ(ki_status_classify(ki_status_of(&r, 6, 4)), KI_STATUS_NAMES);
    /* One batch: the response status is its status, whatever KI-Batch-Status says. */
    r = answer(429, 1, (const int[]){200});
    CHECK_EQ(ki_status_answer(0, &r, 1), KI_ANSWER_EACH);
    CHECK_EQ(ki_status_of(&r, 1, 0), 429);
    r = answer(424, -1, NULL);
    CHECK_EQ(ki_status_answer(0, &r, 1), KI_ANSWER_EACH);
    CHECK_EQ(ki_status_classify(ki_status_of(&r, 1, 0)), KI_STATUS_NAMES);
    /* Several batches, no KI-Batch-Status: a refusal as a whole (an older collector's 400/415, a
     * proxy's 404, and a 409 or 424 without per-batch statuses) means one batch per request ... */
    static const int single[] = {400, 404, 409, 413, 415, 422, 424};
    for (size_t i = 0; i < sizeof single / sizeof *single; i++) {
        r = answer(single[i], -1, NULL);
        CHECK_EQ(ki_status_answer(0, &r, 3), KI_ANSWER_SINGLE);
    }
    /* ... the key, a wait (429/503 with or without Retry-After), or a redirect apply to every batch alike ... */
    static const int alike[] = {401, 403, 408, 429, 500, 503, 302};
    for (size_t i = 0; i < sizeof alike / sizeof *alike; i++) {
        r = answer(alike[i], -1, NULL);
        r.retry_after = 7;
        CHECK_EQ(ki_status_answer(0, &r, 3), KI_ANSWER_EACH);
        for (int b = 0; b < 3; b++) CHECK_EQ(ki_status_of(&r, 3, b), alike[i]);
    }
    /* ... and a 2xx that does not settle each batch, or a count that differs (or a malformed header,
     * -2), is retried one per request. */
    r = answer(200, -1, NULL);
    CHECK_EQ(ki_status_answer(0, &r, 3), KI_ANSWER_UNSPLIT);
    r = answer(200, 2, each);
    CHECK_EQ(ki_status_answer(0, &r, 3), KI_ANSWER_UNSPLIT);
    r = answer(503, -2, NULL);
    CHECK_EQ(ki_status_answer(0, &r, 3), KI_ANSWER_UNSPLIT);
}

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
    answers();
    printf("ok\n");
    return 0;
}
