/* open_shards: a batch of shards' first touch in one call, without the GIL (#included by _preads.c).
 *
 * open_shards(paths, sidecars, sizes, floor, low_left, fds, crcs, crc_at, raw, raw_at, status)
 *
 * For each shard k: opens paths[k] (bytes; O_RDONLY | O_CLOEXEC | O_NOFOLLOW), checks it is a
 * regular file of sizes[k] bytes, moves the descriptor to >= floor once k >= low_left (floor > 0:
 * see lmdata.io.descriptors) and stores it in fds[k] (int32). When sidecars[k] is not empty, it
 * opens that block-checksum file (O_NOFOLLOW), reads it whole into raw[raw_at[k]:raw_at[k + 1]]
 * (uint8; raw holds one byte more than raw_at's last entry, so a longer file is seen), checks its
 * header (store/blocks.py: magic, 4 KiB blocks, covering sizes[k] bytes, one CRC per block) and
 * copies its CRCs into crcs[crc_at[k]:] (uint32). The caller checks each sidecar's checksum in raw.
 *
 * status[k] (int8): 0 done; 1 the shard's file was not opened (fds[k] = -1); 2 its descriptor is
 * in fds[k] but its sidecar was not read or is not of this layout. Anything not 0 is redone by
 * the caller's Python path, which names the file and what is wrong with it.
 *
 * A 1,160-shard store's first touches cost ~40 us a shard in Python (two opens, a read, an
 * fstat, a dup, and ~15 small steps between them), nearly all of it outside the syscalls.
 */
#include <fcntl.h>
#include <sys/stat.h>

static const char SIDECAR_MAGIC[8] = {'L', 'M', 'D', 'C', 'R', 'C', '1', '\0'};
#define SIDECAR_HEADER 24

/* O_NOATIME: reads skip the kernel's access-time check (touch_atime: 8-15% of a 2 KB pread of a
 * cached page, bench/README.md "Shard count"). Only a file's owner may ask for it; the first EPERM
 * drops it for the rest of the process. Each attempt decides from what it read, so a thread that
 * sees another's EPERM between its open and its check still retries without the flag. */
#ifndef O_NOATIME
#define O_NOATIME 0
#endif
static int noatime_refused = 0;

static int open_shard_file(const char *path, int flags) {
    for (;;) {
        int ask = O_NOATIME && !__atomic_load_n(&noatime_refused, __ATOMIC_RELAXED);
        int fd = open(path, flags | (ask ? O_NOATIME : 0));
        if (fd >= 0) return fd;
        if (errno == EINTR) continue;
        if (errno != EPERM || !ask) return -1;
        __atomic_store_n(&noatime_refused, 1, __ATOMIC_RELAXED);
    }
}

static int open_no_follow(const char *path) {
    return open_shard_file(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);  /* a FIFO: opened, then refused, never waited on */
}

/* The shard's token file, opened, sized and moved; -1 if any of that failed (nothing left open). */
static int open_sized(const char *path, int64_t size, int floor) {
    int fd = open_no_follow(path);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (int64_t)st.st_size != size) {
        close(fd);
        return -1;
    }
    if (floor > 0 && fd < floor) {
        int high = fcntl(fd, F_DUPFD_CLOEXEC, floor);
        if (high >= 0) {
            close(fd);
            fd = high;
        }
    }
    return fd;
}

/* The sidecar read into dst (want bytes; dst has room for one more) and its CRCs copied out: 1, or 0. */
static int read_sidecar(const char *path, char *dst, int64_t want, int64_t data_bytes, uint32_t *crcs) {
    int fd = open_no_follow(path);
    if (fd < 0) return 0;
    int64_t got = 0;
    for (;;) {  /* to the end of the file, or one byte past what the manifest records */
        size_t ask = (size_t)(want + 1 - got);
        ssize_t n = read(fd, dst + got, ask);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += n;
        if (got > want || (size_t)n < ask) break;  /* a regular file's short read is its end */
    }
    close(fd);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return 0;  /* the sidecar is little-endian: a big-endian host takes the Python path */
#endif
    if (got != want || want < SIDECAR_HEADER || memcmp(dst, SIDECAR_MAGIC, 8) != 0) return 0;
    uint32_t block_bytes;
    uint64_t covered;
    memcpy(&block_bytes, dst + 8, 4);
    memcpy(&covered, dst + 16, 8);
    int64_t n_blocks = (data_bytes + BLOCK - 1) / BLOCK;
    if (block_bytes != BLOCK || (int64_t)covered != data_bytes || want != SIDECAR_HEADER + 4 * n_blocks) return 0;
    memcpy(crcs, dst + SIDECAR_HEADER, (size_t)(4 * n_blocks));
    return 1;
}

static PyObject *open_shards(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths, *sidecars;
    int floor, low_left;
    Py_buffer sizes, fds, crcs, crc_at, raw, raw_at, status;
    if (!PyArg_ParseTuple(args, "O!O!y*iiw*w*y*w*y*w*", &PyList_Type, &paths, &PyList_Type, &sidecars, &sizes,
                          &floor, &low_left, &fds, &crcs, &crc_at, &raw, &raw_at, &status))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    const int64_t *size = sizes.buf, *c_at = crc_at.buf, *r_at = raw_at.buf;
    int ok = PyList_GET_SIZE(sidecars) == n && sizes.len == n * 8 && fds.len == n * 4 && crc_at.len == n * 8
             && raw_at.len == (n + 1) * 8 && status.len == n && (n == 0 || raw.len > r_at[n]);
    const char **tok = ok ? calloc((size_t)(2 * n + 1), sizeof(char *)) : NULL;
    const char **crc_path = tok ? tok + n : NULL;
    const Py_ssize_t n_crcs = crcs.len / 4;
    for (Py_ssize_t k = 0; tok && ok && k < n; k++) {
        PyObject *p = PyList_GET_ITEM(paths, k), *s = PyList_GET_ITEM(sidecars, k);
        ok = PyBytes_Check(p) && PyBytes_Check(s) && size[k] >= 0 && r_at[k] >= 0 && r_at[k] <= r_at[k + 1];
        if (ok && PyBytes_GET_SIZE(s) > 0)  /* the CRCs must land inside crcs */
            ok = c_at[k] >= 0 && c_at[k] + (size[k] + BLOCK - 1) / BLOCK <= n_crcs;
        if (ok) {
            tok[k] = PyBytes_AS_STRING(p);
            crc_path[k] = PyBytes_GET_SIZE(s) > 0 ? PyBytes_AS_STRING(s) : NULL;
        }
    }
    if (ok && tok) {
        int32_t *fd = fds.buf;
        int8_t *st = status.buf;
        char *dst = raw.buf;
        uint32_t *crc = crcs.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t k = 0; k < n; k++) {
            fd[k] = open_sized(tok[k], size[k], k >= low_left ? floor : 0);
            st[k] = fd[k] < 0 ? 1 : 0;
            if (!st[k] && crc_path[k] && !read_sidecar(crc_path[k], dst + r_at[k], r_at[k + 1] - r_at[k], size[k],
                                                       crc + c_at[k]))
                st[k] = 2;
        }
        Py_END_ALLOW_THREADS
    }
    free(tok);
    PyBuffer_Release(&sizes); PyBuffer_Release(&fds); PyBuffer_Release(&crcs); PyBuffer_Release(&crc_at);
    PyBuffer_Release(&raw); PyBuffer_Release(&raw_at); PyBuffer_Release(&status);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "open_shards: paths not bytes, arrays of different lengths, or raw/crcs "
                                          "too small");
        return NULL;
    }
    if (!tok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}
