/* ki_test.h - the few assertions the C unit tests need; a failure prints where and exits 1. */
#ifndef KI_TEST_H
#define KI_TEST_H
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);     \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define CHECK_EQ(a, b)                                                                                         \
    do {                                                                                                       \
        long long _a = (long long)(a), _b = (long long)(b);                                                    \
        if (_a != _b) {                                                                                        \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b, _a, _b);  \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)
#endif
