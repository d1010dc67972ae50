/* main.c - ki-agent: configuration, signals, the agent's run. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ki_agent.h"
#include "ki_config.h"
#include "ki_log.h"

extern char **environ;

/* The only process-wide state: what the signal handlers set. */
static volatile sig_atomic_t stop_requested;
static volatile sig_atomic_t reload_requested;

static void on_stop(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void on_reload(int sig) {
    (void)sig;
    reload_requested = 1;
}

int main(int argc, char **argv) {
    struct ki_config cfg;
    char err[512];
    int rc = ki_config_load(&cfg, argc, argv, environ, stdout, err, sizeof err);
    if (rc == KI_CONFIG_EXIT) return 0;
    struct ki_log log;
    ki_log_init(&log, KI_LOG_INFO, STDERR_FILENO);
    if (rc < 0) {
        ki_log_error(&log, "configuration: %s", err);
        return 2;
    }
    ki_log_init(&log, ki_log_level_parse(cfg.log_level), STDERR_FILENO);
    if (sodium_init() < 0) {
        ki_log_error(&log, "libsodium failed to initialise");
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_reload;
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
    struct ki_agent *agent = ki_agent_create(&cfg, &log, err, sizeof err);
    if (!agent) {
        ki_log_error(&log, "cannot start: %s", err);
        return 1;
    }
    rc = ki_agent_run(agent, &stop_requested, &reload_requested);
    ki_agent_destroy(agent);
    return rc < 0 ? 1 : 0;
}
