/* Unit test: the config table (config.c): defaults, file, environment, flags, errors. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#include "ki_config.h"
#include "ki_test.h"

int main(int argc, char **argv) {
    CHECK(argc == 2); /* a scratch file path */
    struct ki_config c;
    char err[512];
    FILE *devnull = fopen("/dev/null", "w");
    char *none[] = {NULL};
    char *a0[] = {"ki-agent", NULL};
    CHECK_EQ(ki_config_load(&c, 1, a0, none, devnull, err, sizeof err), 0);
    CHECK_EQ(c.drain_interval_ms, 100);
    CHECK_EQ(c.spool_max_mb, 256);
    CHECK(!strcmp(c.collector, "http://127.0.0.1:8470"));
    char name[300];
    ki_config_ring_name(&c, name, sizeof name);
    CHECK(!strcmp(name, "/kernel_insight.0"));
    FILE *f = fopen(argv[1], "w");
    fputs("  # settings\nring = /custom\nspool_fsync = yes\nbatch_records=128\n", f);
    fclose(f);
    char env_cfg[600];
    snprintf(env_cfg, sizeof env_cfg, "KI_AGENT_CONFIG=%s", argv[1]);
    char *env[] = {env_cfg, "KI_AGENT_BATCH_RECORDS=256", "OTHER=1", NULL};
    char *a1[] = {"ki-agent", "--no-spool-fsync", "--zstd_level", "5", NULL};
    CHECK_EQ(ki_config_load(&c, 4, a1, env, devnull, err, sizeof err), 0);
    ki_config_ring_name(&c, name, sizeof name);
    CHECK(!strcmp(name, "/custom"));
    CHECK_EQ(c.spool_fsync, 0);
    CHECK_EQ(c.batch_records, 256);
    CHECK_EQ(c.zstd_level, 5);
    char *a2[] = {"ki-agent", "--ring-capacity", "1000", NULL};
    CHECK(ki_config_load(&c, 3, a2, none, devnull, err, sizeof err) < 0);
    CHECK(strstr(err, "power of two") != NULL);
    char *a3[] = {"ki-agent", "positional", NULL};
    CHECK(ki_config_load(&c, 2, a3, none, devnull, err, sizeof err) < 0);
    CHECK(strstr(err, "unexpected argument") != NULL);
    char *a4[] = {"ki-agent", "--backoff-min-ms", "5000", "--backoff-max-ms", "10", NULL};
    CHECK(ki_config_load(&c, 5, a4, none, devnull, err, sizeof err) < 0);
    char *a5[] = {"ki-agent", "--help", NULL};
    CHECK_EQ(ki_config_load(&c, 2, a5, none, devnull, err, sizeof err), KI_CONFIG_EXIT);
    char padded[] = " \t key = value \r\n", blank[] = " \n", bare[] = "x";
    CHECK(!strcmp(ki_config_trim(padded), "key = value"));
    CHECK(!strcmp(ki_config_trim(blank), ""));
    CHECK(!strcmp(ki_config_trim(bare), "x"));
    fclose(devnull);
    puts("ok");
    return 0;
}
