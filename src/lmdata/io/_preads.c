/* _preads: many positional reads in one call, without the GIL (lmdata.io.descriptors).
 *
 * preads(fds, offsets, lengths, out) reads, for each k, lengths[k] bytes of descriptor fds[k]
 * at offsets[k] into out, one after another (out[sum(lengths[:k]):...]). fds is an int32
 * buffer, offsets and lengths int64 buffers, out a writable contiguous buffer of at least
 * sum(lengths) bytes. Returns -1 when every read was whole, else the index of the first read
 * that failed or came back short (the caller redoes that one to name the file and errno).
 * A loader batch is 32 windows: one call instead of 32 Python-level os.preadv calls.
 *
 * read_windows(fds, offsets, lengths, file_bytes, block0, done, crcs, out, check) reads piece k
 * (lengths[k] bytes at offsets[k] of descriptor fds[k]) into out, one after another (a window
 * across a shard boundary is two pieces). With check, the 4 KiB blocks under it not yet marked
 * in done (uint8, one per block of the split; the file's first block is block0[k]) are checked
 * first: the block-aligned span is read once, each new block's CRC-32 compared with crcs
 * (uint32, same indexing) and marked, and the piece copied out of the span. Returns -1, or the
 * index of the first piece that read short or failed a CRC (its failing block left unmarked):
 * the caller's Python path then names the block or recovers.
 *
 * open_shards(...) opens many shards at once for their first touch (_open_shards.c); read_batch(...)
 * reads a batch of windows from their starts, the pieces found in C (_read_batch.c); map_files and
 * read_mapped do it out of read-only mappings (_mapped.c); check_ahead checks a later batch's blocks on a
 * thread of its own (_check_ahead.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define BLOCK 4096

/* The CRC-32 the block checks use: zlib's (~1.9 GB/s here), or, after use_crc32(address), a
 * function of the same contract, e.g. ISA-L's crc32_gzip_refl (~6.6 GB/s; lmdata.io.descriptors
 * passes its address when the isal package is there). A first-epoch window checks ~6 KiB:
 * ~3.3 us through zlib, ~0.9 us through ISA-L. */
typedef uint32_t (*crc32_fn)(uint32_t crc, const unsigned char *buf, uint64_t len);
static uint32_t zlib_crc32(uint32_t crc, const unsigned char *buf, uint64_t len) {
    return (uint32_t)crc32((uLong)crc, (const Bytef *)buf, (uInt)len);
}
static crc32_fn block_crc32 = zlib_crc32;

/* A block's mark in done and a shard's mapping address in bases are shared with the check-ahead
 * thread (_check_ahead.c): read and written as relaxed atomics (plain moves on x86-64 and Arm64).
 * A mark only goes 0 -> 1, after its block's CRC matched; an address only goes to 0 (retired). */
#define DONE(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define MARK_DONE(p) __atomic_store_n((p), (uint8_t)1, __ATOMIC_RELAXED)
#define BASE(p) __atomic_load_n((p), __ATOMIC_RELAXED)

static PyObject *preads(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer fds, offs, lens, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &fds, &offs, &lens, &out)) return NULL;
    Py_ssize_t n = fds.len / (Py_ssize_t)sizeof(int32_t), failed = -1, total = 0;
    int ok = offs.len == n * (Py_ssize_t)sizeof(int64_t) && lens.len == n * (Py_ssize_t)sizeof(int64_t);
    const int32_t *fd = fds.buf;
    const int64_t *off = offs.buf, *len = lens.buf;
    for (Py_ssize_t k = 0; ok && k < n; k++) {
        if (len[k] < 0) ok = 0;
        else total += (Py_ssize_t)len[k];
    }
    if (!ok || total > out.len) {
        PyBuffer_Release(&fds); PyBuffer_Release(&offs); PyBuffer_Release(&lens); PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "preads: fds, offsets and lengths differ in count, or out is too small");
        return NULL;
    }
    char *dst = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t done = 0;
        while (done < len[k]) {
            ssize_t got = pread(fd[k], dst + done, (size_t)(len[k] - done), (off_t)(off[k] + done));
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            done += got;
        }
        if (done != len[k]) { failed = k; break; }
        dst += len[k];
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&fds); PyBuffer_Release(&offs); PyBuffer_Release(&lens); PyBuffer_Release(&out);
    return PyLong_FromSsize_t(failed);
}

static int read_all(int fd, char *dst, int64_t len, int64_t off) {
    int64_t done = 0;
    while (done < len) {
        ssize_t got = pread(fd, dst + done, (size_t)(len - done), (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        done += got;
    }
    return 1;
}

/* Check blocks lo..hi of a file not yet marked in done (indexed from block0), whose block lo starts at
 * first (the blocks' bytes one after another), marking each; 0 at the first that fails its CRC (left
 * unmarked). */
static int check_new_blocks(const char *first, int64_t lo, int64_t hi, int64_t file_bytes, int64_t block0,
                            uint8_t *done, const uint32_t *crcs) {
    for (int64_t b = lo; b <= hi; b++) {
        if (DONE(&done[block0 + b])) continue;
        int64_t n_at = file_bytes - b * BLOCK < BLOCK ? file_bytes - b * BLOCK : BLOCK;
        if (block_crc32(0, (const unsigned char *)(first + (b - lo) * BLOCK), (uint64_t)n_at) != crcs[block0 + b])
            return 0;
        MARK_DONE(&done[block0 + b]);
    }
    return 1;
}

/* One piece: len bytes at off of fd into dst; with check, its unchecked 4 KiB blocks (done, indexed
 * from block0) read as one aligned span, checked against crcs and marked first. 1 read, 0 failed. */
static int read_piece(int fd, int64_t off, int64_t len, int64_t file_bytes, int64_t block0, uint8_t *done,
                      Py_ssize_t n_blocks, const uint32_t *crcs, char *dst, int check, char *span) {
    if (len == 0) return 1;
    int64_t lo = off / BLOCK, hi = (off + len - 1) / BLOCK, b;
    int fresh = 0;
    if (check) {
        if (block0 < 0 || block0 + hi >= n_blocks) return 0;
        for (b = lo; b <= hi; b++) fresh |= !DONE(&done[block0 + b]);
    }
    if (!fresh) return read_all(fd, dst, len, off);
    int64_t a = lo * BLOCK, z = (hi + 1) * BLOCK;
    if (z > file_bytes) z = file_bytes;
    if (z - a < off - a + len || !read_all(fd, span, z - a, a)) return 0;
    if (!check_new_blocks(span, lo, hi, file_bytes, block0, done, crcs)) return 0;
    memcpy(dst, span + (off - a), (size_t)len);
    return 1;
}

/* The same piece out of a mapping of the file at base (read_mapped, _mapped.c): its unchecked blocks
 * checked on the mapping and marked first. 1 read, 0 failed. */
static int copy_piece(const char *base, int64_t off, int64_t len, int64_t file_bytes, int64_t block0, uint8_t *done,
                      Py_ssize_t n_blocks, const uint32_t *crcs, char *dst, int check) {
    if (len == 0) return 1;
    if (off < 0 || off + len > file_bytes) return 0;
    if (check) {
        int64_t lo = off / BLOCK, hi = (off + len - 1) / BLOCK;
        if (block0 < 0 || block0 + hi >= n_blocks
            || !check_new_blocks(base + lo * BLOCK, lo, hi, file_bytes, block0, done, crcs))
            return 0;
    }
    memcpy(dst, base + off, (size_t)len);
    return 1;
}

static Py_ssize_t read_windows_nogil(Py_ssize_t n, const int32_t *fd, const int64_t *off, const int64_t *len,
                                     const int64_t *file_bytes, const int64_t *block0, uint8_t *done,
                                     Py_ssize_t n_blocks, const uint32_t *crcs, char *dst, int check,
                                     char *span) {
    for (Py_ssize_t k = 0; k < n; dst += len[k], k++)
        if (!read_piece(fd[k], off[k], len[k], file_bytes[k], block0[k], done, n_blocks, crcs, dst, check, span))
            return k;
    return -1;
}

static PyObject *read_windows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer fds, offs, lens, sizes, base, done, crcs, out;
    int check;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*y*w*p", &fds, &offs, &lens, &sizes, &base, &done, &crcs, &out, &check))
        return NULL;
    Py_ssize_t n = fds.len / (Py_ssize_t)sizeof(int32_t), failed = -2, total = 0;
    int64_t longest = 0;
    int ok = offs.len == n * 8 && lens.len == n * 8 && sizes.len == n * 8 && base.len == n * 8
             && crcs.len == done.len * 4;
    const int64_t *len = lens.buf;
    for (Py_ssize_t k = 0; ok && k < n; k++) {
        if (len[k] < 0) ok = 0;
        total += (Py_ssize_t)len[k];
        if (len[k] > longest) longest = len[k];
    }
    ok = ok && total <= out.len;
    char *span = ok ? malloc((size_t)longest + 2 * BLOCK) : NULL;
    if (span) {
        Py_BEGIN_ALLOW_THREADS
        failed = read_windows_nogil(n, fds.buf, offs.buf, len, sizes.buf, base.buf, done.buf, done.len, crcs.buf,
                                    out.buf, check, span);
        Py_END_ALLOW_THREADS
        free(span);
    }
    PyBuffer_Release(&fds); PyBuffer_Release(&offs); PyBuffer_Release(&lens); PyBuffer_Release(&sizes);
    PyBuffer_Release(&base); PyBuffer_Release(&done); PyBuffer_Release(&crcs); PyBuffer_Release(&out);
    if (failed == -2) {
        if (ok) return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError, "read_windows: arrays of different lengths, a negative length, "
                                          "or done/crcs/out too small");
        return NULL;
    }
    return PyLong_FromSsize_t(failed);
}

static PyObject *use_crc32(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address)) return NULL;
    if (!address) {
        block_crc32 = zlib_crc32;
        Py_RETURN_FALSE;
    }
    crc32_fn fn = (crc32_fn)(uintptr_t)address;
    unsigned char probe[BLOCK + 3];
    for (int i = 0; i < BLOCK + 3; i++) probe[i] = (unsigned char)(i * 131 + 7);
    int same = 1;  /* the same answers as zlib's on a few lengths, or it is not used */
    const uint64_t lens[] = {0, 1, 7, 64, 1000, BLOCK, BLOCK + 3};
    for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
        same &= fn(0, probe, lens[j]) == zlib_crc32(0, probe, lens[j]);
    block_crc32 = same ? fn : zlib_crc32;
    return PyBool_FromLong(same);
}

/* block_crcs(data, block_bytes, out): out[b] = CRC-32 of data's block b (the last may be short),
 * through the same function as the block checks (ISA-L's where use_crc32 took it), without the
 * GIL. A writer's sidecar and a decoded copy's: one call, where a Python loop of 512 crc32 calls
 * per 2 MiB shard took ~0.8 ms. */
static PyObject *block_crcs(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, out;
    Py_ssize_t block_bytes;
    if (!PyArg_ParseTuple(args, "y*nw*", &data, &block_bytes, &out)) return NULL;
    Py_ssize_t n_blocks = block_bytes > 0 ? (data.len + block_bytes - 1) / block_bytes : -1;
    if (n_blocks < 0 || out.len != n_blocks * 4) {
        PyBuffer_Release(&data); PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "block_crcs: block_bytes must be > 0 and out hold one uint32 per block");
        return NULL;
    }
    const unsigned char *src = (const unsigned char *)data.buf;
    uint32_t *dst = (uint32_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < n_blocks; b++) {
        Py_ssize_t at = b * block_bytes, n = data.len - at < block_bytes ? data.len - at : block_bytes;
        dst[b] = block_crc32(0, src + at, (uint64_t)n);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data); PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* span_crcs(data, lo, hi, out): out[i] = CRC-32 of data[lo[i]:hi[i]] (int64 byte offsets), through the
 * block checks' function, without the GIL. Lance's row CRCs at write: ~1,600 rows a 1 Mi-token shard,
 * where a Python generator of crc32 calls took ~1.8 ms a shard, holding the GIL the encoders' feed needs. */
static PyObject *span_crcs(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, lo, hi, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &data, &lo, &hi, &out)) return NULL;
    Py_ssize_t n = lo.len / 8;
    const int64_t *a = lo.buf, *b = hi.buf;
    int ok = lo.len % 8 == 0 && hi.len == lo.len && out.len == n * 4;
    for (Py_ssize_t i = 0; ok && i < n; i++) ok = 0 <= a[i] && a[i] <= b[i] && b[i] <= data.len;
    if (ok) {
        const unsigned char *src = (const unsigned char *)data.buf;
        uint32_t *dst = (uint32_t *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = block_crc32(0, src + a[i], (uint64_t)(b[i] - a[i]));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data); PyBuffer_Release(&lo); PyBuffer_Release(&hi); PyBuffer_Release(&out);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "span_crcs: lo/hi int64 of one length, 0 <= lo <= hi <= len(data), "
                                          "out one uint32 per span");
        return NULL;
    }
    Py_RETURN_NONE;
}

#include "_open_shards.c"
#include "_read_batch.c"
#include "_mapped.c"
#include "_check_ahead.c"

static PyMethodDef methods[] = {
    {"use_crc32", use_crc32, METH_VARARGS,
     "use_crc32(address) -> whether the block checks now use that C function (0: zlib's again)"},
    {"read_windows", read_windows, METH_VARARGS,
     "read_windows(fds, offsets, lengths, file_bytes, block0, done, crcs, out, check) -> -1, or the first failed piece"},
    {"open_shards", open_shards, METH_VARARGS,
     "open_shards(paths, sidecars, sizes, floor, low_left, fds, crcs, crc_at, raw, raw_at, status): first touches"},
    {"read_batch", read_batch, METH_VARARGS,
     "read_batch(starts, length, itemsize, bounds, fds, modes, file_bytes, block_base, done, crcs, out, check)"},
    {"map_files", map_files, METH_VARARGS,
     "map_files(paths, fds, sizes, bases) -> None; bases[k]: the read-only mapping's address (0: none)"},
    {"unmap", unmap, METH_VARARGS, "unmap(bases, sizes) -> None; the mappings map_files made"},
    {"read_mapped", read_mapped, METH_VARARGS,
     "read_mapped(starts, length, itemsize, bounds, bases, modes, file_bytes, block_base, done, crcs, out, check)"},
    {"check_ahead", check_ahead, METH_VARARGS,
     "check_ahead(starts, length, itemsize, bounds, bases, modes, file_bytes, block_base, done, crcs[, out, status, "
     "check]) -> unchecked blocks (and windows read ahead) the jobs finished since met (-1: none finished); the "
     "windows' block checks handed to the check-ahead thread, or with out and status (int64[2]) the windows read "
     "into out as read_mapped would: status[0] gets its result (-3 until then), status[1] the job's ticket"},
    {"check_ahead_wait", check_ahead_wait, METH_VARARGS,
     "check_ahead_wait([ticket[, cancel]]) -> as check_ahead's count, once the jobs handed over before it (up to "
     "ticket) have run or were dropped; with cancel, that job is not run if it has not started (no wait)"},
    {"span_crcs", span_crcs, METH_VARARGS,
     "span_crcs(data, lo, hi, out) -> None; out[i]: the CRC-32 of data[lo[i]:hi[i]] (int64 offsets, uint32 out)"},
    {"block_crcs", block_crcs, METH_VARARGS,
     "block_crcs(data, block_bytes, out) -> None; out[b]: the CRC-32 of data's block b (uint32)"},
    {"preads", preads, METH_VARARGS, "preads(fds, offsets, lengths, out) -> -1, or the index of the first short read"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_preads", "Batched positional reads.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__preads(void) {
    ahead_init();
    return PyModule_Create(&module);
}
