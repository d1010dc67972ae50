/*
 * ki_labels.h - the instance labels of the agent's configuration (labels = "model=llama-70b,rack=r1").
 *
 * Checked once at start, with the collector's rules for enrolment labels, and kept as a
 * ready-made LABELS body section (docs/wire.md) that every sealed batch carries: the collector
 * applies them to this instance and its series (enrolment labels win over these).
 */
#ifndef KI_LABELS_H
#define KI_LABELS_H

#include <stddef.h>
#include <stdint.h>

#include "ki_config.h"
#include "ki_wire.h"

/* The section: tag, length, count, and per label two lengths (1-2 bytes each) and the text,
 * which is at most the setting's own length. */
#define KI_LABELS_SECTION_MAX (1u + 10u + 1u + (unsigned)KI_LABELS_MAX * 4u + KI_CONFIG_PATH)

struct ki_labels {
    unsigned n;                               /* labels set; 0: no section is sent */
    size_t len;                               /* bytes of section */
    uint8_t section[KI_LABELS_SECTION_MAX];   /* tag, length, body, ready to append */
};

/* Parse "k=v,k2=v2" (spaces around items are ignored; "" sets none). Names are Prometheus label
 * names, not __-prefixed and not one the collector sets itself (instance, gpu, gpu_product, le,
 * simulated); values are 1-200 bytes without commas or line breaks; no name twice.
 * Returns 0, or -EINVAL with the reason in err and no label set. */
int ki_labels_parse(struct ki_labels *l, const char *text, char *err, size_t errlen);

/* Append the section to out (cap bytes); returns the bytes written (0 when no labels or no room). */
size_t ki_labels_section(const struct ki_labels *l, uint8_t *out, size_t cap);

#endif /* KI_LABELS_H */
