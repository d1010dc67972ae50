/* config.c - settings from one table (ki_config.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ki_log.h"

#define KI_AGENT_VERSION "0.1.0"

enum ki_cfg_type { KI_CFG_STR, KI_CFG_INT, KI_CFG_BOOL };

struct ki_config_entry {
    const char *key;      /* setting name (flags accept - for _) */
    enum ki_cfg_type type; /* value type */
    const char *def;      /* default, as text */
    size_t offset;        /* field in struct ki_config */
    size_t size;          /* string field size */
    int64_t min, max;     /* integer range */
    const char *help;     /* one line for --help */
};

#define STR(k, d, n, h) {#k, KI_CFG_STR, d, offsetof(struct ki_config, k), n, 0, 0, h}
#define INT(k, d, lo, hi, h) {#k, KI_CFG_INT, d, offsetof(struct ki_config, k), 0, lo, hi, h}
#define BOOL(k, d, h) {#k, KI_CFG_BOOL, d, offsetof(struct ki_config, k), 0, 0, 1, h}

static const struct ki_config_entry ENTRIES[] = {
    STR(ring, "0", KI_CONFIG_STR, "GPU index or UUID, or the ring's shm name starting with /"),
    BOOL(ring_create, "0", "create the ring when it does not exist yet"),
    INT(ring_capacity, "32768", 2, 1LL << 30, "slots of a ring the agent creates (power of two)"),
    INT(ring_keep_kb, "4608", 0, 1LL << 30, "keep the ring's pages mapped while the agent's resident memory, the whole ring included, stays under this many kB (no page faults: about a third less CPU a record); past it they are handed back as read; 0: always handed back"),
    STR(collector, "http://127.0.0.1:8470", KI_CONFIG_STR, "collector URL (http://host:port or https://host:port)"),
    STR(tls_ca_file, "", KI_CONFIG_PATH, "PEM file of CAs trusted for https (empty: the system's trust store)"),
    STR(key_file, "/etc/kernel-insight/agent.key", KI_CONFIG_PATH, "the agent's key file, mode 0600 (ki keys add)"),
    STR(spool_dir, "/var/lib/kernel-insight/agent", KI_CONFIG_PATH, "spool directory (also holds the epoch file)"),
    INT(spool_max_mb, "256", 1, 1 << 20, "spool size bound in MiB; past it the oldest batches are dropped"),
    BOOL(spool_fsync, "0", "fsync every spooled batch (survives power loss, costs I/O)"),
    INT(dead_letter_max_mb, "16", 1, 1 << 20, "bound of the dead-letter file of refused batches (kept twice: current and .1)"),
    INT(request_max_kb, "256", 1, 16384, "a backlog is sent as requests of several batches up to this size"),
    INT(drain_interval_ms, "100", 1, 60000, "how often the ring is drained and a batch sealed"),
    INT(batch_records, "4096", 64, 1 << 20, "most records in one batch (a quarter of it with histograms on)"),
    INT(heartbeat_s, "10", 1, 86400, "seal a batch (counters only) after this long without one"),
    INT(zstd_level, "1", 1, 19, "zstd compression level (1: least memory and CPU; higher saves little here)"),
    INT(connect_timeout_ms, "1000", 1, 600000, "TCP connect timeout"),
    INT(io_timeout_ms, "5000", 1, 600000, "HTTP send and receive timeout"),
    INT(backoff_min_ms, "100", 1, 3600000, "first retry delay after a failure"),
    INT(backoff_max_ms, "30000", 1, 3600000, "longest retry delay"),
    INT(auth_retry_s, "300", 1, 86400, "after 401/403, wait this long before trying again (SIGHUP: now)"),
    INT(shutdown_timeout_s, "5", 0, 3600, "on SIGTERM, try this long to deliver what is spooled"),
    INT(names_max, "4096", 16, 1 << 22, "kernel and function names the agent remembers"),
    INT(names_bytes, "262144", 1024, 1LL << 30, "bytes of name text the agent remembers"),
    INT(name_max, "1024", 32, 65535, "longest name shipped; longer names are cut and counted"),
    BOOL(histograms, "1", "aggregate kernels, NCCL ops and memcpys into native histograms; ship only sampled spans"),
    INT(histogram_schema, "3", -4, 8, "initial native-histogram schema (bucket growth 2^(2^-schema); 3: 9% per bucket)"),
    INT(histogram_interval_s, "7", 1, 3600, "how often the histograms are shipped (7: the shortest that keeps 100k kernels/s with the default spans within 4 KB/s; docs/agent.md, Wire budget)"),
    INT(histogram_snapshot_s, "300", 0, 86400, "ship increments (buckets added since the last export), a full snapshot of every histogram at least this often; 0: cumulative only (wire body v3)"),
    INT(histogram_max_buckets, "160", 8, 4096, "populated buckets per histogram; past it the schema is lowered"),
    INT(histogram_max_keys, "12288", 16, 1 << 22, "histograms held (pid, gpu, stream, kernel); new ones past it are counted and lost"),
    INT(histogram_idle_s, "300", 0, 86400 * 30, "forget a histogram that shipped no change for this long (its process exited: room for new keys); 0: never"),
    INT(span_seal_ms, "1000", 1, 3600000, "with histograms on: kept spans and other records wait in memory up to this long and are sealed together (fewer, larger batches)"),
    INT(span_sample_rate, "50", 0, 10000000, "uniformly sampled kernel spans shipped per second"),
    INT(span_tail_rate, "200", 0, 10000000, "most kernel spans above their kernel's tail quantile shipped per second"),
    INT(span_tail_permille, "990", 500, 1000, "spans slower than this quantile of their kernel (per mille; 990: p99) are tail"),
    STR(log_level, "info", KI_CONFIG_STR, "debug, info, warn or error"),
    STR(labels, "", KI_CONFIG_PATH, "instance labels k=v,k2=v2 (model, host, rack, ...) sent with every batch; enrolment labels win"),
};
#define NENTRIES (sizeof ENTRIES / sizeof ENTRIES[0])

static int fail(char *err, size_t errlen, int rc, const char *fmt, const char *a, const char *b) {
    snprintf(err, errlen, fmt, a, b);
    return rc;
}

static const struct ki_config_entry *find(const char *key, size_t len) {
    for (size_t i = 0; i < NENTRIES; i++) {
        const char *k = ENTRIES[i].key;
        if (strlen(k) != len) continue;
        size_t j = 0;
        for (; j < len; j++) {
            char c = key[j] == '-' ? '_' : (char)tolower((unsigned char)key[j]);
            if (c != k[j]) break;
        }
        if (j == len) return &ENTRIES[i];
    }
    return NULL;
}

static int set(struct ki_config *cfg, const struct ki_config_entry *e, const char *value, const char *where, char *err,
               size_t errlen) {
    char *field = (char *)cfg + e->offset;
    if (e->type == KI_CFG_STR) {
        size_t n = strlen(value);
        if (n >= e->size) return fail(err, errlen, -EINVAL, "%s: value of %s is too long", where, e->key);
        memcpy(field, value, n + 1);
        return 0;
    }
    int64_t v;
    if (e->type == KI_CFG_BOOL) {
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on"))
            v = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "off"))
            v = 0;
        else
            return fail(err, errlen, -EINVAL, "%s: %s must be true or false", where, e->key);
    } else {
        char *end;
        errno = 0;
        long long x = strtoll(value, &end, 10);
        if (errno || end == value || *end) return fail(err, errlen, -EINVAL, "%s: %s must be an integer", where, e->key);
        if (x < e->min || x > e->max) {
            char range[96];
            snprintf(range, sizeof range, "%s must be in [%lld, %lld]", e->key, (long long)e->min, (long long)e->max);
            return fail(err, errlen, -ERANGE, "%s: %s", where, range);
        }
        v = x;
    }
    memcpy(field, &v, sizeof v);
    return 0;
}

char *ki_config_trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static int load_file(struct ki_config *cfg, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) return fail(err, errlen, -errno, "cannot read config file %s: %s", path, strerror(errno));
    char line[2048], where[KI_CONFIG_PATH + 32];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        char *s = ki_config_trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = fail(err, errlen, -EINVAL, "%s: expected 'key = value'%s", where, "");
            break;
        }
        *eq = '\0';
        char *key = ki_config_trim(s), *value = ki_config_trim(eq + 1);
        const struct ki_config_entry *e = find(key, strlen(key));
        if (!e) {
            rc = fail(err, errlen, -EINVAL, "%s: unknown setting '%s' (see --help)", where, key);
            break;
        }
        rc = set(cfg, e, value, where, err, errlen);
    }
    fclose(f);
    return rc;
}

int ki_config_load(struct ki_config *cfg, int argc, char **argv, char **envp, FILE *out, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    int rc, print = 0;
    for (size_t i = 0; i < NENTRIES; i++)
        if ((rc = set(cfg, &ENTRIES[i], ENTRIES[i].def, "default", err, errlen)) < 0) return rc;
    /* The config file comes first, so find it before anything else. */
    const char *file = NULL;
    for (char **e = envp; e && *e; e++)
        if (!strncmp(*e, "KI_AGENT_CONFIG=", 16)) file = *e + 16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) file = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9)) file = argv[i] + 9;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            ki_config_help(out);
            return KI_CONFIG_EXIT;
        }
        if (!strcmp(argv[i], "--version")) {
            fprintf(out, "ki-agent %s\n", KI_AGENT_VERSION);
            return KI_CONFIG_EXIT;
        }
    }
    if (file && *file) {
        if (strlen(file) >= sizeof cfg->config_file) return fail(err, errlen, -ENAMETOOLONG, "config path too long%s%s", "", "");
        strcpy(cfg->config_file, file);
        if ((rc = load_file(cfg, file, err, errlen)) < 0) return rc;
    }
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, "KI_AGENT_", 9) || !strncmp(*e, "KI_AGENT_CONFIG=", 16)) continue;
        const char *name = *e + 9, *eq = strchr(name, '=');
        if (!eq) continue;
        const struct ki_config_entry *ent = find(name, (size_t)(eq - name));
        char where[300];
        snprintf(where, sizeof where, "environment %.*s", (int)(eq - *e), *e);
        if (!ent) return fail(err, errlen, -EINVAL, "%s: unknown setting (see --help)%s", where, "");
        if ((rc = set(cfg, ent, eq + 1, where, err, errlen)) < 0) return rc;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) return fail(err, errlen, -EINVAL, "unexpected argument '%s' (see --help)%s", a, "");
        a += 2;
        const char *eq = strchr(a, '=');
        size_t klen = eq ? (size_t)(eq - a) : strlen(a);
        if (!strcmp(a, "print-config")) {
            print = 1;
            continue;
        }
        if (klen == 6 && !strncmp(a, "config", 6)) {
            if (!eq) i++;
            continue;
        }
        const struct ki_config_entry *ent = find(a, klen);
        int negated = 0;
        if (!ent && klen > 3 && !strncmp(a, "no-", 3)) {
            ent = find(a + 3, klen - 3);
            negated = ent && ent->type == KI_CFG_BOOL;
            if (!negated) ent = NULL;
        }
        if (!ent) return fail(err, errlen, -EINVAL, "unknown option '%s' (see --help)%s", argv[i], "");
        const char *value;
        if (eq) value = eq + 1;
        else if (ent->type == KI_CFG_BOOL) value = negated ? "0" : "1";
        else if (i + 1 < argc) value = argv[++i];
        else return fail(err, errlen, -EINVAL, "option --%s needs a value%s", ent->key, "");
        char where[300];
        snprintf(where, sizeof where, "option --%s", ent->key);
        if ((rc = set(cfg, ent, value, where, err, errlen)) < 0) return rc;
    }
    if (ki_log_level_parse(cfg->log_level) < 0)
        return fail(err, errlen, -EINVAL, "log_level '%s' is not one of debug, info, warn, error%s", cfg->log_level, "");
    if (cfg->ring_capacity & (cfg->ring_capacity - 1))
        return fail(err, errlen, -EINVAL, "ring_capacity must be a power of two%s%s", "", "");
    if (cfg->backoff_min_ms > cfg->backoff_max_ms)
        return fail(err, errlen, -EINVAL, "backoff_min_ms must not exceed backoff_max_ms%s%s", "", "");
    if (!cfg->ring[0]) return fail(err, errlen, -EINVAL, "ring must not be empty%s%s", "", "");
    if (print) {
        ki_config_print(cfg, out);
        return KI_CONFIG_EXIT;
    }
    return 0;
}

void ki_config_help(FILE *out) {
    fprintf(out,
            "usage: ki-agent [--config FILE] [--SETTING VALUE | --SETTING=VALUE ...]\n"
            "\n"
            "Drains one GPU's Kernel Insight ring, seals batches (zstd, ChaCha20-Poly1305) and\n"
            "ships them to the collector; see docs/agent.md and docs/wire.md.\n"
            "\n"
            "Every setting can come from the config file (key = value lines), the environment\n"
            "(KI_AGENT_<KEY>) or a flag; flags win over the environment, which wins over the file.\n"
            "Boolean flags also take the forms --SETTING and --no-SETTING.\n"
            "\n"
            "  --config FILE          config file (env KI_AGENT_CONFIG)\n"
            "  --print-config         print the effective settings and exit\n"
            "  --help, --version\n\n");
    for (size_t i = 0; i < NENTRIES; i++) {
        /* The flag as users type it (--ring-create; --ring_create is taken too), the environment
         * variable, and the config file's key (ring_create). */
        char env[64], flag[64];
        size_t j = 0;
        for (const char *k = ENTRIES[i].key; *k && j < sizeof env - 1; k++, j++) {
            env[j] = (char)toupper((unsigned char)*k);
            flag[j] = *k == '_' ? '-' : *k;
        }
        env[j] = flag[j] = '\0';
        fprintf(out, "  --%-20s %s\n  %-22s default %s; env KI_AGENT_%s; file %s\n", flag, ENTRIES[i].help, "",
                ENTRIES[i].def, env, ENTRIES[i].key);
    }
}

void ki_config_print(const struct ki_config *cfg, FILE *out) {
    for (size_t i = 0; i < NENTRIES; i++) {
        const char *field = (const char *)cfg + ENTRIES[i].offset;
        if (ENTRIES[i].type == KI_CFG_STR) {
            fprintf(out, "%s = %s\n", ENTRIES[i].key, field);
        } else {
            int64_t v;
            memcpy(&v, field, sizeof v);
            fprintf(out, "%s = %lld\n", ENTRIES[i].key, (long long)v);
        }
    }
}

void ki_config_ring_name(const struct ki_config *cfg, char *out, size_t outlen) {
    if (cfg->ring[0] == '/') snprintf(out, outlen, "%s", cfg->ring);
    else snprintf(out, outlen, "/kernel_insight.%s", cfg->ring);
}
