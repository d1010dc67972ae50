/* spool.c - one file per sealed batch, indexed by runs (ki_spool.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_spool.h"
#include "ki_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ki_seal.h"

#define TRAILER_BYTES 24u
static const char TRAILER_MAGIC[8] = {'K', 'I', 'S', 'P', 'O', 'O', 'L', '1'};

#define DEAD_LETTER "dead-letter"          /* the dead-letter file in the spool directory */
#define DEAD_LETTER_OLD "dead-letter.1"    /* its previous generation, once it reached its bound */
#define DEAD_ENTRY_BYTES 24u               /* magic, status, reserved, unix time ns, frame length */
static const char DEAD_MAGIC[4] = {'K', 'I', 'D', 'L'};

struct ki_spool {
    int dirfd;                                   /* the spool directory */
    uint64_t max_bytes;                          /* bound */
    uint64_t dead_max_bytes;                     /* bound of the dead-letter file (twice this with its old generation) */
    int do_fsync;                                /* fsync each file */
    struct ki_spool_run runs[KI_SPOOL_MAX_RUNS]; /* oldest first */
    size_t nruns;                                /* runs in use */
    struct ki_spool_stats st;                    /* size and drops */
    struct ki_spool_mark last_mark;              /* newest batch's mark at open */
    int have_mark;                               /* last_mark is valid */
};

static void name_of(char *out, size_t len, uint32_t epoch, uint64_t seq) {
    snprintf(out, len, "%08" PRIx32 "-%016" PRIx64 ".kib", epoch, seq);
}

static int parse_name(const char *name, uint32_t *epoch, uint64_t *seq) {
    unsigned int e;
    unsigned long long s;
    int used = 0;
    if (strlen(name) != 8 + 1 + 16 + 4 || sscanf(name, "%8x-%16llx.kib%n", &e, &s, &used) != 2 || used != 29)
        return -EINVAL;
    *epoch = e;
    *seq = s;
    return 0;
}

static void run_add(struct ki_spool *sp, uint32_t epoch, uint64_t seq);

/* Forget the oldest run entirely (its files are removed by the caller's drop loop). */
static void runs_shift(struct ki_spool *sp) {
    memmove(sp->runs, sp->runs + 1, (sp->nruns - 1) * sizeof sp->runs[0]);
    sp->nruns--;
}

struct ki_spool *ki_spool_create(const char *dir, uint64_t max_bytes, uint64_t dead_max_bytes, int do_fsync, char *err,
                                 size_t errlen) {
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create spool directory %s: %s", dir, strerror(errno));
        return NULL;
    }
    struct ki_spool *sp = calloc(1, sizeof *sp);
    if (!sp) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sp->max_bytes = max_bytes;
    sp->dead_max_bytes = dead_max_bytes;
    sp->do_fsync = do_fsync;
    sp->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sp->dirfd < 0) {
        snprintf(err, errlen, "cannot open spool directory %s: %s", dir, strerror(errno));
        free(sp);
        return NULL;
    }
    /* Index what is there: runs by epoch (a sorted insert; epochs are few). */
    int fd = dup(sp->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        snprintf(err, errlen, "cannot list spool directory %s: %s", dir, strerror(errno));
        if (fd >= 0) close(fd);
        ki_spool_destroy(sp);
        return NULL;
    }
    struct dirent *ent;
    uint32_t newest_epoch = 0;
    uint64_t newest_seq = 0;
    int have_newest = 0;
    while ((ent = readdir(d)) != NULL) {
        uint32_t epoch;
        uint64_t seq;
        if (ent->d_name[0] == '.' && strncmp(ent->d_name, ".tmp-", 5) == 0) {
            unlinkat(sp->dirfd, ent->d_name, 0); /* a write the last run did not finish */
            continue;
        }
        if (parse_name(ent->d_name, &epoch, &seq) < 0) continue;
        struct stat st;
        if (fstatat(sp->dirfd, ent->d_name, &st, 0) < 0) continue;
        sp->st.bytes += (uint64_t)st.st_size;
        sp->st.batches++;
        run_add(sp, epoch, seq);
        if (!have_newest || epoch > newest_epoch || (epoch == newest_epoch && seq > newest_seq)) {
            newest_epoch = epoch;
            newest_seq = seq;
            have_newest = 1;
        }
    }
    closedir(d);
    if (have_newest) {
        char name[64];
        uint8_t t[TRAILER_BYTES];
        struct stat st;
        name_of(name, sizeof name, newest_epoch, newest_seq);
        int f = openat(sp->dirfd, name, O_RDONLY | O_CLOEXEC);
        if (f >= 0 && fstat(f, &st) == 0 && st.st_size >= (off_t)TRAILER_BYTES &&
            pread(f, t, sizeof t, st.st_size - (off_t)TRAILER_BYTES) == (ssize_t)sizeof t &&
            !memcmp(t, TRAILER_MAGIC, 8)) {
            memcpy(&sp->last_mark.ring_created_ns, t + 8, 8);
            memcpy(&sp->last_mark.next_pos, t + 16, 8);
            sp->have_mark = 1;
        }
        if (f >= 0) close(f);
    }
    return sp;
}

void ki_spool_destroy(struct ki_spool *sp) {
    if (!sp) return;
    if (sp->dirfd >= 0) close(sp->dirfd);
    free(sp);
}

/* Widen (or insert) the run of epoch to cover seq; runs stay sorted by epoch. */
static void run_add(struct ki_spool *sp, uint32_t epoch, uint64_t seq) {
    size_t i = 0;
    while (i < sp->nruns && sp->runs[i].epoch < epoch) i++;
    if (i < sp->nruns && sp->runs[i].epoch == epoch) {
        struct ki_spool_run *r = &sp->runs[i];
        if (seq < r->first) r->first = seq;
        if (seq + 1 > r->end) r->end = seq + 1;
        return;
    }
    if (sp->nruns == KI_SPOOL_MAX_RUNS) {
        if (i == 0) return; /* older than everything we track: it is found again at the next start */
        runs_shift(sp);     /* the oldest run's files stay until a start re-indexes them */
        i--;
    }
    memmove(sp->runs + i + 1, sp->runs + i, (sp->nruns - i) * sizeof sp->runs[0]);
    sp->runs[i] = (struct ki_spool_run){epoch, seq, seq + 1};
    sp->nruns++;
}

/* Open the oldest batch file after `after` (NULL: the oldest of all, advancing past holes at the front).
 * Returns an fd, or -ENOENT when there is none. */
static int open_next(struct ki_spool *sp, const struct ki_spool_id *after, struct ki_spool_id *id) {
    for (size_t i = 0; i < sp->nruns;) {
        struct ki_spool_run *r = &sp->runs[i];
        uint64_t seq = r->first;
        if (after && (r->epoch < after->epoch || (r->epoch == after->epoch && after->seq + 1 >= r->end))) {
            i++;
            continue;
        }
        if (after && r->epoch == after->epoch && after->seq + 1 > seq) seq = after->seq + 1;
        if (!after && seq >= r->end) {
            if (sp->nruns == 1) return -ENOENT; /* keep the current run for appends */
            runs_shift(sp);
            continue;
        }
        for (; seq < r->end; seq++) {
            char name[64];
            name_of(name, sizeof name, r->epoch, seq);
            int fd = openat(sp->dirfd, name, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                id->epoch = r->epoch;
                id->seq = seq;
                return fd;
            }
            if (errno != ENOENT) return -errno;
            if (!after) r->first = seq + 1; /* a hole at the front: the batch was dropped, sent or never written */
        }
        if (after) i++;
    }
    return -ENOENT;
}

static int open_oldest(struct ki_spool *sp, struct ki_spool_id *id) { return open_next(sp, NULL, id); }

static int drop_oldest(struct ki_spool *sp) {
    struct ki_spool_id id;
    int fd = open_oldest(sp, &id);
    if (fd < 0) return fd;
    uint8_t head[KI_HEADER_BYTES];
    uint32_t epoch = 0, count = 0;
    uint64_t seq = 0;
    if (pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head) ki_seal_peek_header(head, sizeof head, &epoch, &seq, &count);
    close(fd);
    int rc = ki_spool_remove(sp, id);
    if (rc == 0) {
        sp->st.dropped_batches++;
        sp->st.dropped_records += count;
    }
    return rc;
}

int ki_spool_last_mark(const struct ki_spool *sp, struct ki_spool_mark *mark) {
    if (!sp->have_mark) return -ENOENT;
    *mark = sp->last_mark;
    return 0;
}

int ki_spool_put(struct ki_spool *sp, const uint8_t *frame, size_t flen, const struct ki_spool_mark *mark) {
    uint32_t epoch, count;
    uint64_t seq;
    if (ki_seal_peek_header(frame, flen, &epoch, &seq, &count) < 0) return -EINVAL;
    size_t len = flen + TRAILER_BYTES;
    uint8_t trailer[TRAILER_BYTES];
    memcpy(trailer, TRAILER_MAGIC, 8);
    memcpy(trailer + 8, &mark->ring_created_ns, 8);
    memcpy(trailer + 16, &mark->next_pos, 8);
    if (len > sp->max_bytes) {
        sp->st.dropped_batches++;
        sp->st.dropped_records += count;
        return 0;
    }
    while (sp->st.bytes + len > sp->max_bytes && sp->st.batches) {
        int rc = drop_oldest(sp);
        if (rc == -ENOENT) break;
        if (rc < 0) return rc;
    }
    char name[64], tmp[80];
    name_of(name, sizeof name, epoch, seq);
    snprintf(tmp, sizeof tmp, ".tmp-%s", name);
    int fd = openat(sp->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    size_t off = 0;
    while (off < len) {
        ssize_t w = off < flen ? write(fd, frame + off, flen - off)
                               : write(fd, trailer + (off - flen), len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            unlinkat(sp->dirfd, tmp, 0);
            return -e;
        }
        off += (size_t)w;
    }
    if ((sp->do_fsync && fsync(fd) < 0) || close(fd) < 0 || renameat(sp->dirfd, tmp, sp->dirfd, name) < 0) {
        int e = errno;
        unlinkat(sp->dirfd, tmp, 0);
        return -e;
    }
    if (sp->do_fsync) fsync(sp->dirfd);
    sp->st.bytes += len;
    sp->st.batches++;
    run_add(sp, epoch, seq);
    return 0;
}

/* Read the batch file fd (closing it) into buf. */
static int read_frame(int fd, uint8_t *buf, size_t cap, size_t *len) {
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (st.st_size < (off_t)(KI_HEADER_BYTES + TRAILER_BYTES)) {
        close(fd);
        return -EBADMSG;
    }
    if ((uint64_t)st.st_size - TRAILER_BYTES > cap) {
        close(fd);
        return -EMSGSIZE;
    }
    size_t off = 0, want = (size_t)st.st_size - TRAILER_BYTES;
    while (off < want) {
        ssize_t r = pread(fd, buf + off, want - off, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            return -e;
        }
        off += (size_t)r;
    }
    close(fd);
    /* The frame must be exactly what its header says (64 + payload_len): anything else was damaged on disk. */
    uint32_t plen;
    memcpy(&plen, buf + KI_HEADER_BYTES - 4, 4);
    if (memcmp(buf, KI_WIRE_MAGIC, KI_WIRE_MAGIC_BYTES) || (uint64_t)plen + KI_HEADER_BYTES != want) return -EBADMSG;
    *len = want;
    return 0;
}

int ki_spool_peek(struct ki_spool *sp, uint8_t *buf, size_t cap, size_t *len, struct ki_spool_id *id) {
    int fd = open_oldest(sp, id);
    return fd < 0 ? fd : read_frame(fd, buf, cap, len);
}

int ki_spool_peek_after(struct ki_spool *sp, struct ki_spool_id after, uint8_t *buf, size_t cap, size_t *len,
                        struct ki_spool_id *id) {
    int fd = open_next(sp, &after, id);
    return fd < 0 ? fd : read_frame(fd, buf, cap, len);
}

int ki_spool_dead_letter(struct ki_spool *sp, struct ki_spool_id id, const uint8_t *frame, size_t len, int status,
                         uint64_t now_ns) {
    uint64_t entry = DEAD_ENTRY_BYTES + (uint64_t)len;
    int rc = 0;
    if (entry > sp->dead_max_bytes) {
        rc = -EFBIG;
    } else {
        struct stat st;
        if (fstatat(sp->dirfd, DEAD_LETTER, &st, 0) == 0 && (uint64_t)st.st_size + entry > sp->dead_max_bytes &&
            renameat(sp->dirfd, DEAD_LETTER, sp->dirfd, DEAD_LETTER_OLD) < 0)
            rc = -errno;
        int fd = rc < 0 ? -1 : openat(sp->dirfd, DEAD_LETTER, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (rc == 0 && fd < 0) rc = -errno;
        if (fd >= 0) {
            uint8_t head[DEAD_ENTRY_BYTES] = {0};
            uint16_t s16 = (uint16_t)status;
            uint32_t l32 = (uint32_t)len;
            memcpy(head, DEAD_MAGIC, 4);
            memcpy(head + 4, &s16, 2);
            memcpy(head + 8, &now_ns, 8);
            memcpy(head + 16, &l32, 4);
            struct stat before;
            off_t start = fstat(fd, &before) == 0 ? before.st_size : 0;
            rc = ki_write_all(fd, head, sizeof head);
            if (rc == 0) rc = ki_write_all(fd, frame, len);
            if (rc == 0 && sp->do_fsync && fsync(fd) < 0) rc = -errno;
            if (rc < 0 && ftruncate(fd, start) < 0) rc = -errno; /* never leave half an entry */
            close(fd);
        }
    }
    int rm = ki_spool_remove(sp, id);
    return rc < 0 ? rc : rm;
}

int ki_spool_remove(struct ki_spool *sp, struct ki_spool_id id) {
    char name[64];
    name_of(name, sizeof name, id.epoch, id.seq);
    struct stat st;
    if (fstatat(sp->dirfd, name, &st, 0) < 0) return -errno;
    if (unlinkat(sp->dirfd, name, 0) < 0) return -errno;
    sp->st.bytes -= (uint64_t)st.st_size < sp->st.bytes ? (uint64_t)st.st_size : sp->st.bytes;
    if (sp->st.batches) sp->st.batches--;
    if (sp->nruns && sp->runs[0].epoch == id.epoch && sp->runs[0].first == id.seq) sp->runs[0].first++;
    return 0;
}

void ki_spool_stats(const struct ki_spool *sp, struct ki_spool_stats *out) { *out = sp->st; }
