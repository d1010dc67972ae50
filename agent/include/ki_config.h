/*
 * ki_config.h - the agent's settings: one declarative table drives defaults,
 * the config file, KI_AGENT_* environment variables, command-line flags and --help.
 *
 * Precedence, lowest first: defaults, config file (--config or KI_AGENT_CONFIG),
 * environment, flags. Unknown keys are errors in every source.
 */
#ifndef KI_CONFIG_H
#define KI_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KI_CONFIG_STR 256u  /* bytes of a string setting, NUL included */
#define KI_CONFIG_PATH 1024u /* bytes of a path setting, NUL included */

struct ki_config {
    char ring[KI_CONFIG_STR];         /* GPU index/uuid, or a shm name starting with / */
    int64_t ring_create;              /* create the ring when it does not exist */
    int64_t ring_capacity;            /* slots of a ring this agent creates */
    int64_t ring_keep_kb;             /* the ring's pages stay mapped while the agent's resident memory, ring included, stays under this (kB) */
    char collector[KI_CONFIG_STR];    /* http[s]://host:port of the collector */
    char tls_ca_file[KI_CONFIG_PATH]; /* CA certificates for https; "" = the system's */
    char key_file[KI_CONFIG_PATH];    /* the agent's key file (ki keys add) */
    char spool_dir[KI_CONFIG_PATH];   /* on-disk spool and epoch file */
    int64_t spool_max_mb;             /* spool bound; oldest batches dropped past it */
    int64_t spool_fsync;              /* fsync each spooled batch (power-loss safety) */
    int64_t dead_letter_max_mb;       /* bound of the dead-letter file (refused batches) */
    int64_t request_max_kb;           /* most bytes of batches in one request (a single batch may be larger) */
    int64_t drain_interval_ms;        /* ring drain period */
    int64_t batch_records;            /* most records in one batch */
    int64_t heartbeat_s;              /* seal an empty batch after this long without one */
    int64_t zstd_level;               /* compression level */
    int64_t connect_timeout_ms;       /* TCP connect timeout */
    int64_t io_timeout_ms;            /* send/receive timeout */
    int64_t backoff_min_ms;           /* first retry delay */
    int64_t backoff_max_ms;           /* retry delay cap */
    int64_t auth_retry_s;             /* after 401/403, wait this long before trying again */
    int64_t shutdown_timeout_s;       /* on SIGTERM, try this long to deliver the spool */
    int64_t names_max;                /* names the agent remembers */
    int64_t names_bytes;              /* bytes of name text it remembers */
    int64_t name_max;                 /* longest name shipped; longer ones are cut */
    int64_t histograms;               /* aggregate kernels into native histograms (wire body v2) */
    int64_t histogram_schema;         /* initial native-histogram schema, -4..8 */
    int64_t histogram_interval_s;     /* histogram export period */
    int64_t histogram_snapshot_s;     /* increments with a snapshot this often (0: cumulative only) */
    int64_t histogram_max_buckets;    /* populated buckets per histogram before the schema drops */
    int64_t histogram_max_keys;       /* histograms (pid, gpu, stream, kernel) the agent holds */
    int64_t histogram_idle_s;         /* evict a histogram that shipped no change this long (0: never) */
    int64_t span_seal_ms;             /* histograms on: records wait in memory up to this long before a batch is sealed */
    int64_t span_sample_rate;         /* uniformly sampled kernel spans kept per second */
    int64_t span_tail_rate;           /* most tail kernel spans kept per second */
    int64_t span_tail_permille;       /* spans above this quantile (per mille) of their kernel are tail */
    char log_level[KI_CONFIG_STR];    /* debug, info, warn, error */
    char labels[KI_CONFIG_PATH];      /* instance labels "k=v,k2=v2" sent with every batch (ki_labels.h) */
    char config_file[KI_CONFIG_PATH]; /* the config file read, if any */
};

/* Results of ki_config_load beyond 0. */
#define KI_CONFIG_EXIT 1 /* --help or --version was printed: exit 0 */

/* Fill cfg from defaults, file, environment (envp) and argv. Returns 0,
 * KI_CONFIG_EXIT, or a negative errno with a message in err. */
int ki_config_load(struct ki_config *cfg, int argc, char **argv, char **envp, FILE *out, char *err, size_t errlen);

/* Print usage and every setting with its default, environment variable and description. */
void ki_config_help(FILE *out);

/* Print "key = value" for every setting (what --print-config shows). */
void ki_config_print(const struct ki_config *cfg, FILE *out);

/* s with its leading and trailing white space cut (the trailing in place): the one trim of the
 * agent's "key = value" files (the config file, the key file). Returns a pointer into s. */
char *ki_config_trim(char *s);

/* The ring's shm name: the ring setting itself when it starts with /, else /kernel_insight.<ring>. */
void ki_config_ring_name(const struct ki_config *cfg, char *out, size_t outlen);

#endif /* KI_CONFIG_H */
