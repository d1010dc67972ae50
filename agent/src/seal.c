/* seal.c - header, nonce, epoch and ChaCha20-Poly1305 (ki_seal.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_seal.h"

#include "ki_config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static int hex_decode(const char *hex, uint8_t *out, size_t n) {
    if (strlen(hex) != 2 * n) return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            int c = tolower((unsigned char)hex[2 * i + (size_t)j]);
            int d = isdigit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
            if (d < 0) return -EINVAL;
            v = v * 16 + d;
        }
        out[i] = (uint8_t)v;
    }
    return 0;
}

int ki_seal_load_key(struct ki_seal *s, const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot read key file %s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || (st.st_mode & 077)) {
        close(fd);
        snprintf(err, errlen, "key file %s is readable by others (mode %04o): chmod 600 it", path,
                 (unsigned)(st.st_mode & 07777));
        return -EPERM;
    }
    char buf[1024];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot read key file %s: %s", path, strerror(e));
        return -e;
    }
    buf[n] = '\0';
    int have = 0, rc = 0;
    struct ki_seal tmp;
    memset(&tmp, 0, sizeof tmp);
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line && rc == 0; line = strtok_r(NULL, "\n", &save)) {
        char *l = ki_config_trim(line);
        if (!*l || *l == '#') continue;
        char *eq = strchr(l, '=');
        if (!eq) {
            rc = -EINVAL;
            break;
        }
        *eq = '\0';
        char *k = ki_config_trim(l), *v = ki_config_trim(eq + 1);
        if (!strcmp(k, "agent_id")) {
            rc = hex_decode(v, tmp.agent_id, KI_AGENT_ID_BYTES);
            have |= 1;
        } else if (!strcmp(k, "key_id")) {
            char *end;
            unsigned long x = strtoul(v, &end, 10);
            if (*end || end == v || x > UINT32_MAX) rc = -EINVAL;
            tmp.key_id = (uint32_t)x;
            have |= 2;
        } else if (!strcmp(k, "key")) {
            rc = hex_decode(v, tmp.key, KI_KEY_BYTES);
            have |= 4;
        } else {
            rc = -EINVAL;
        }
    }
    sodium_memzero(buf, sizeof buf);
    if (rc < 0 || have != 7) {
        sodium_memzero(&tmp, sizeof tmp);
        snprintf(err, errlen, "key file %s is not a Kernel Insight agent key file (agent_id, key_id, key)", path);
        return -EINVAL;
    }
    memcpy(s->agent_id, tmp.agent_id, sizeof s->agent_id);
    memcpy(s->key, tmp.key, sizeof s->key);
    s->key_id = tmp.key_id;
    sodium_memzero(&tmp, sizeof tmp);
    return 0;
}

int ki_seal_next_epoch(struct ki_seal *s, const char *dir, uint32_t now_s, char *err, size_t errlen) {
    char path[1200], tmp[1220];
    snprintf(path, sizeof path, "%s/epoch", dir);
    snprintf(tmp, sizeof tmp, "%s/.epoch.tmp", dir);
    uint64_t stored = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1) stored = v;
        fclose(f);
    }
    uint64_t epoch = stored + 1 > now_s ? stored + 1 : now_s;
    if (epoch > UINT32_MAX) {
        snprintf(err, errlen, "epoch file %s holds %llu: out of range", path, (unsigned long long)stored);
        return -ERANGE;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    char text[32];
    int len = snprintf(text, sizeof text, "%llu\n", (unsigned long long)epoch);
    if (fd < 0 || write(fd, text, (size_t)len) != len || fsync(fd) < 0 || close(fd) < 0 || rename(tmp, path) < 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        snprintf(err, errlen, "cannot persist the epoch in %s: %s (nonces must never repeat)", path, strerror(e));
        return -e;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    s->epoch = (uint32_t)epoch;
    s->next_seq = 0;
    return 0;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

int ki_seal_frame(struct ki_seal *s, uint8_t *frame, size_t plen, unsigned compression, uint64_t t_min,
                  uint64_t t_max, uint32_t count, size_t *frame_len) {
    if (plen + KI_TAG_BYTES > UINT32_MAX) return -E2BIG;
    uint64_t seq = s->next_seq;
    uint8_t *h = frame;
    memcpy(h, KI_WIRE_MAGIC, KI_WIRE_MAGIC_BYTES);
    h[4] = KI_WIRE_VERSION;
    h[5] = KI_AEAD_CHACHA20_POLY1305;
    h[6] = (uint8_t)compression;
    h[7] = 0;
    memcpy(h + 8, s->agent_id, KI_AGENT_ID_BYTES);
    put32(h + 24, s->key_id);
    put32(h + 28, s->epoch);
    put64(h + 32, seq);
    put64(h + 40, t_min);
    put64(h + 48, t_max);
    put32(h + 56, count);
    put32(h + 60, (uint32_t)(plen + KI_TAG_BYTES));
    uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
    put32(nonce, s->epoch);
    put64(nonce + 4, seq);
    unsigned long long clen = 0;
    if (crypto_aead_chacha20poly1305_ietf_encrypt(frame + KI_HEADER_BYTES, &clen, frame + KI_HEADER_BYTES, plen, h,
                                                  KI_HEADER_BYTES, NULL, nonce, s->key) != 0)
        return -EIO;
    s->next_seq++;
    *frame_len = KI_HEADER_BYTES + (size_t)clen;
    return 0;
}

int ki_seal_reseal(struct ki_seal *s, const uint8_t old_key[KI_KEY_BYTES], uint8_t *frame, size_t len,
                   size_t *frame_len) {
    if (len < KI_HEADER_BYTES + KI_TAG_BYTES || memcmp(frame, KI_WIRE_MAGIC, KI_WIRE_MAGIC_BYTES)) return -EINVAL;
    uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES];
    memcpy(nonce, frame + 28, 12); /* epoch || seq, as sealed */
    size_t clen = len - KI_HEADER_BYTES - KI_TAG_BYTES;
    const uint8_t *mac = frame + KI_HEADER_BYTES + clen;
    /* Verify first without output: a failed in-place decrypt would zero the frame. */
    if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(NULL, NULL, frame + KI_HEADER_BYTES, clen, mac, frame,
                                                           KI_HEADER_BYTES, nonce, old_key) != 0)
        return -EBADMSG;
    if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(frame + KI_HEADER_BYTES, NULL, frame + KI_HEADER_BYTES, clen,
                                                           mac, frame, KI_HEADER_BYTES, nonce, old_key) != 0)
        return -EBADMSG;
    unsigned long long plen = clen;
    uint64_t t_min, t_max;
    uint32_t count;
    memcpy(&t_min, frame + 40, 8);
    memcpy(&t_max, frame + 48, 8);
    memcpy(&count, frame + 56, 4);
    return ki_seal_frame(s, frame, (size_t)plen, frame[6], t_min, t_max, count, frame_len);
}

int ki_seal_peek_header(const uint8_t *frame, size_t len, uint32_t *epoch, uint64_t *seq, uint32_t *count) {
    if (len < KI_HEADER_BYTES || memcmp(frame, KI_WIRE_MAGIC, KI_WIRE_MAGIC_BYTES)) return -EINVAL;
    memcpy(epoch, frame + 28, 4);
    memcpy(seq, frame + 32, 8);
    memcpy(count, frame + 56, 4);
    return 0;
}

void ki_seal_wipe(struct ki_seal *s) {
    if (s) sodium_memzero(s->key, sizeof s->key);
}
