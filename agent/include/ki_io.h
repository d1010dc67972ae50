/*
 * ki_io.h - small file I/O helpers shared by the spool and the name table.
 */
#ifndef KI_IO_H
#define KI_IO_H

#include <errno.h>
#include <stddef.h>
#include <unistd.h>

/* Write all len bytes of buf to fd (retrying on EINTR and short writes). Returns 0 or a negative errno. */
static inline int ki_write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -errno : -EIO;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

#endif /* KI_IO_H */
