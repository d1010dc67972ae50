// probe_spans_raii.cpp - the C++ RAII guard of ki_probe.h: 3 x "raii_span".  Usage: probe_spans_raii RING_NAME
#include "ki_probe.h"

#include <cstdio>

static ki_probe probe;

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char err[256];
    if (ki_probe_init(&probe, 0, argv[1], err, sizeof err) < 0) {
        std::fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint32_t id = ki_probe_name(&probe, "raii_span");
    for (int i = 0; i < 3; i++) {
        ki::Span span(probe, id);
    }
    ki_probe_close(&probe);
    return probe.written == 3 ? 0 : 1;
}
