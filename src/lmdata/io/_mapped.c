/* Mapped shards: a batch's windows copied out of read-only mappings (#included by _preads.c).
 *
 * map_files(paths, fds, sizes, bases) maps each file read-only and shared: with fds[k] >= 0 that
 * descriptor (already opened and sized), else paths[k] opened here (O_NOFOLLOW, as open_shards),
 * its size checked against sizes[k], mapped and closed again: a mapping holds no descriptor.
 * bases[k] (int64) gets the mapping's address, or 0 where the file is gone, is not sizes[k]
 * bytes long or could not be mapped (the caller's pread path then names the error). Empty files
 * are not mapped (0). unmap(bases, sizes) undoes it.
 *
 * read_mapped(starts, length, itemsize, bounds, bases, modes, file_bytes, block_base, done, crcs,
 * out, check) is read_batch (_read_batch.c) with each piece memcpy'd from bases[i] instead of
 * pread from a descriptor: -1 when every window was read; -2 before reading anything when a shard
 * the batch needs is not mapped (bases[i] == 0) or, with check, has no CRCs loaded (modes[i] !=
 * 1); else the index of the first window that failed a CRC or met a file cut short under its
 * mapping (SIGBUS, caught: the caller's pread path names the file).
 *
 * check_mapped_nogil(...) does ahead of time, on the check-ahead thread (_check_ahead.c), what
 * read_mapped does to windows before it copies them: their unchecked blocks checked and marked (one
 * that fails is left unmarked: the read names it). A window whose shards are not all mapped with
 * their CRCs loaded is skipped; a window cut short under its mapping (SIGBUS caught) ends the walk.
 *
 * Why: a warm window through pread costs ~1.6 us of syscall and per-file kernel work (the file's
 * struct, inode and page-cache tree, cold at 1,000+ shards: 70 against 50 us a batch at 1,160
 * shards), a memcpy out of a mapping ~0.35 us whatever the number of files (raw batches of 32 x
 * 1,025 tokens, 6 and 1,160 shards: 50-54 us by pread, 11-14 us mapped).
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

static __thread sigjmp_buf *bus_jump;  /* set while this thread copies out of mappings */
static struct sigaction bus_before;    /* the handler found when ours was installed */

/* A file truncated under its mapping raises SIGBUS at the copy: jump back to read_mapped, which
 * reports the window; any other SIGBUS goes to the handler that was there before (restored, and
 * the faulting instruction runs again into it). */
static void on_bus(int sig, siginfo_t *info, void *ctx) {
    (void)sig; (void)info; (void)ctx;
    sigjmp_buf *jump = bus_jump;
    if (jump) siglongjmp(*jump, 1);
    sigaction(SIGBUS, &bus_before, NULL);
}

/* With the GIL held, before every batch: ours is put back whenever another handler has replaced it
 * (a torch DataLoader worker installs its own, for its shared memory, and chains to no one; it is
 * kept as the one a fault outside our copies goes to). */
static void install_bus_handler(void) {
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) != 0) return;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_bus) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  /* not blocked after the jump: no mask to restore */
    sigemptyset(&sa.sa_mask);
    bus_before = now;
    sigaction(SIGBUS, &sa, NULL);
}

static PyObject *map_files(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *paths;
    Py_buffer fds, sizes, bases;
    if (!PyArg_ParseTuple(args, "O!y*y*w*", &PyList_Type, &paths, &fds, &sizes, &bases)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(paths);
    int ok = fds.len == n * 4 && sizes.len == n * 8 && bases.len == n * 8;
    const char **names = ok ? calloc((size_t)n + 1, sizeof(char *)) : NULL;
    for (Py_ssize_t k = 0; names && k < n; k++) {
        PyObject *p = PyList_GET_ITEM(paths, k);
        if (!PyBytes_Check(p)) { ok = 0; break; }
        names[k] = PyBytes_AS_STRING(p);
    }
    if (ok && names) {
        const int32_t *fd = fds.buf;
        const int64_t *size = sizes.buf;
        int64_t *base = bases.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t k = 0; k < n; k++) {
            base[k] = 0;
            if (size[k] <= 0) continue;
            int own = fd[k] < 0, f = own ? open(names[k], O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : fd[k];
            struct stat st;
            if (f < 0) continue;
            if (fstat(f, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == size[k]) {
                void *at = mmap(NULL, (size_t)size[k], PROT_READ, MAP_SHARED, f, 0);
                if (at != MAP_FAILED) base[k] = (int64_t)(uintptr_t)at;
            }
            if (own) close(f);
        }
        Py_END_ALLOW_THREADS
    }
    free(names);
    PyBuffer_Release(&fds); PyBuffer_Release(&sizes); PyBuffer_Release(&bases);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "map_files: a list of bytes paths and int32 fds, int64 sizes and bases, "
                                          "one each");
        return NULL;
    }
    if (!names) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *unmap(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer bases, sizes;
    if (!PyArg_ParseTuple(args, "y*y*", &bases, &sizes)) return NULL;
    Py_ssize_t n = bases.len / 8;
    if (sizes.len == bases.len) {
        const int64_t *base = bases.buf, *size = sizes.buf;
        for (Py_ssize_t k = 0; k < n; k++)
            if (base[k] && size[k] > 0) munmap((void *)(uintptr_t)base[k], (size_t)size[k]);
    }
    PyBuffer_Release(&bases); PyBuffer_Release(&sizes);
    Py_RETURN_NONE;
}

/* read_batch_nogil over the mappings, a SIGBUS in a copy (a file shorter than its mapping) caught:
 * the window it hit is reported as failed. */
static Py_ssize_t read_mapped_nogil(Py_ssize_t n, const int64_t *starts, int64_t length, int itemsize,
                                    const int64_t *bounds, Py_ssize_t n_shards, const int64_t *bases,
                                    const int8_t *modes, const int64_t *file_bytes, const int64_t *block_base,
                                    uint8_t *done, Py_ssize_t n_blocks, const uint32_t *crcs, char *out, int check) {
    sigjmp_buf jump;
    volatile Py_ssize_t at_window = 0;
    if (sigsetjmp(jump, 0)) {
        bus_jump = NULL;
        return at_window;
    }
    bus_jump = &jump;
    Py_ssize_t failed = read_batch_nogil(n, starts, length, itemsize, bounds, n_shards, NULL, bases, modes, file_bytes,
                                         block_base, done, n_blocks, crcs, out, check, NULL, &at_window);
    bus_jump = NULL;
    return failed;
}

/* check_ahead's job (_check_ahead.c): the unchecked blocks under the windows whose shards are all
 * mapped with their CRCs loaded checked and marked, *found counting the unchecked blocks met; a window
 * cut short under its mapping (SIGBUS, caught) ends the walk. */
static void check_mapped_nogil(Py_ssize_t n, const int64_t *starts, int64_t length, int itemsize,
                               const int64_t *bounds, Py_ssize_t n_shards, const int64_t *bases, const int8_t *modes,
                               const int64_t *file_bytes, const int64_t *block_base, uint8_t *done, Py_ssize_t n_blocks,
                               const uint32_t *crcs, int64_t *found) {
    sigjmp_buf jump;
    if (sigsetjmp(jump, 0)) {
        bus_jump = NULL;
        return;
    }
    bus_jump = &jump;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t t = starts[j], left = length;
        if (!window_ready(bounds, n_shards, t, length, NULL, bases, modes, 1)) continue;
        for (Py_ssize_t i = shard_of(bounds, n_shards, t); left > 0 && i < n_shards; i++) {
            int64_t take = bounds[i + 1] - t < left ? bounds[i + 1] - t : left;
            if (take <= 0) continue;  /* an empty shard */
            int64_t off = (t - bounds[i]) * itemsize, len = take * itemsize;
            int64_t base = BASE(&bases[i]);  /* read once: may be retired meanwhile */
            if (!base || off < 0 || off + len > file_bytes[i]) break;
            int64_t lo = off / BLOCK, hi = (off + len - 1) / BLOCK;
            if (block_base[i] < 0 || block_base[i] + hi >= n_blocks) break;
            for (int64_t b = lo; b <= hi; b++) *found += !DONE(&done[block_base[i] + b]);
            check_new_blocks((const char *)(uintptr_t)base + lo * BLOCK, lo, hi, file_bytes[i], block_base[i], done,
                             crcs);
            t += take;
            left -= take;
        }
    }
    bus_jump = NULL;
}

static PyObject *read_mapped(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer starts, bounds, bases, modes, sizes, base, done, crcs, out;
    long long length;
    int itemsize, check;
    if (!PyArg_ParseTuple(args, "y*Liy*y*y*y*y*w*y*w*p", &starts, &length, &itemsize, &bounds, &bases, &modes, &sizes,
                          &base, &done, &crcs, &out, &check))
        return NULL;
    Py_ssize_t n = starts.len / 8, n_shards = bounds.len / 8 - 1, failed = -3;
    const int64_t *s = starts.buf, *b = bounds.buf;
    int ok = batch_args_ok(&starts, length, itemsize, &bounds, &bases, 8, &modes, &sizes, &base, &done, &crcs, &out);
    if (ok) {
        install_bus_handler();
        Py_BEGIN_ALLOW_THREADS
        failed = read_mapped_nogil(n, s, (int64_t)length, itemsize, b, n_shards, bases.buf, modes.buf, sizes.buf,
                                   base.buf, done.buf, done.len, crcs.buf, out.buf, check);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&starts); PyBuffer_Release(&bounds); PyBuffer_Release(&bases); PyBuffer_Release(&modes);
    PyBuffer_Release(&sizes); PyBuffer_Release(&base); PyBuffer_Release(&done); PyBuffer_Release(&crcs);
    PyBuffer_Release(&out);
    if (failed == -3) {
        PyErr_SetString(PyExc_ValueError, "read_mapped: arrays of different lengths, a window outside the split, "
                                          "or done/crcs/out too small");
        return NULL;
    }
    return PyLong_FromSsize_t(failed);
}
