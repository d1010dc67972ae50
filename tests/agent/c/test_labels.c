/* Unit test: the configuration's instance labels (labels.c). Prints, for the Python side of the
 * test (tests/agent/test_agent_units.py), the section of each accepted text in hex and whether each
 * candidate name is accepted, so the section is compared with collector/wire.py's encoder and the
 * names with the collector's enrolment rule (collector/keys.py). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ki_labels.h"
#include "ki_test.h"

/* The report, printed after "ok" once every check passed. */
static char report[16384];
static size_t used;
#define SAY(...) (used += (size_t)snprintf(report + used, sizeof report - used, __VA_ARGS__))

static void print_section(const char *text) {
    struct ki_labels l;
    char err[256] = "";
    CHECK_EQ(ki_labels_parse(&l, text, err, sizeof err), 0);
    uint8_t out[KI_LABELS_SECTION_MAX];
    size_t n = ki_labels_section(&l, out, sizeof out);
    CHECK_EQ(n, l.len);
    SAY("section %s ", text);
    for (size_t i = 0; i < n; i++) SAY("%02x", out[i]);
    SAY("\n");
}

static void refused(const char *text, const char *why) {
    struct ki_labels l;
    char err[256] = "";
    CHECK_EQ(ki_labels_parse(&l, text, err, sizeof err), -EINVAL);
    if (!strstr(err, why)) {
        fprintf(stderr, "\"%s\": error \"%s\" lacks \"%s\"\n", text, err, why);
        CHECK(0);
    }
    CHECK_EQ(l.n, 0);
}

int main(int argc, char **argv) {
    struct ki_labels l;
    char err[256];
    /* Nothing set: no section. */
    CHECK_EQ(ki_labels_parse(&l, "", err, sizeof err), 0);
    uint8_t out[KI_LABELS_SECTION_MAX];
    CHECK_EQ(ki_labels_section(&l, out, sizeof out), 0);
    print_section("model=llama-70b,rack=r1");
    print_section(" model=llama-70b , rack=r1,,zone=us-east_1,");
    /* A value of the longest length, and one byte over. */
    char text[512];
    snprintf(text, sizeof text, "k=%0*d", KI_LABEL_VALUE_MAX, 0);
    print_section(text);
    snprintf(text, sizeof text, "k=%0*d", KI_LABEL_VALUE_MAX + 1, 0);
    refused(text, "the value must be 1-200 bytes");
    /* As many labels as allowed, and one more. */
    size_t off = 0;
    for (int i = 0; i < KI_LABELS_MAX; i++) off += (size_t)snprintf(text + off, sizeof text - off, "l%d=v,", i);
    CHECK(ki_labels_parse(&l, text, err, sizeof err) == 0 && l.n == KI_LABELS_MAX);
    snprintf(text + off, sizeof text - off, "one=more");
    refused(text, "more than 16 labels");
    /* No room: nothing written. */
    CHECK_EQ(ki_labels_parse(&l, "a=b", err, sizeof err), 0);
    CHECK_EQ(ki_labels_section(&l, out, l.len - 1), 0);
    refused("model", "expected name=value");
    refused("model=", "the value must be");
    refused("a=b,a=c", "label given twice");
    refused("9x=1", "invalid label name");
    refused("__x=1", "invalid label name");
    refused("a-b=1", "invalid label name");
    refused("instance=x", "label set by the collector itself");
    /* Each name given on the command line: accepted or not, for the Python side to compare. */
    for (int i = 1; i < argc; i++) {
        snprintf(text, sizeof text, "%s=v", argv[i]);
        SAY("name %s %s\n", argv[i], ki_labels_parse(&l, text, err, sizeof err) == 0 ? "yes" : "no");
    }
    CHECK(used < sizeof report);
    printf("ok\n%s", report);
    return 0;
}
