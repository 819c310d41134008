/* read_batch: a batch of windows from their starts in one call, without the GIL (#included by _preads.c).
 *
 * read_batch(starts, length, itemsize, bounds, fds, modes, file_bytes, block_base, done, crcs, out, check)
 *
 * Window j is tokens [starts[j], starts[j] + length) of the split, whose shard i holds tokens
 * [bounds[i], bounds[i + 1]) (int64, one more than the shards) in descriptor fds[i] (int32). Each
 * window is read into out[j * length * itemsize:] as one piece per shard it spans, as
 * read_windows reads a piece (with check: its unchecked 4 KiB blocks checked first against crcs,
 * the shard's first block being block_base[i]). Returns -1 when every window was read; -2 before
 * reading anything when a shard the batch needs has no descriptor (fds[i] < 0) or, with check,
 * its CRCs are not in crcs (modes[i] != 1): the caller opens it on its Python path; else the index
 * of the first window that read short or failed a CRC (its failing block left unmarked).
 *
 * What it replaces is the reader's per-batch NumPy (the windows' pieces, their descriptors and
 * block indices: ~15-35 us a batch of 32, more at 100,000-token shards, where ~28% of batches
 * hold a window across a shard boundary) ahead of read_windows.
 */

/* The shard holding token t: the last i with bounds[i] <= t (bounds ascending, bounds[0] = 0, t inside the split).
 * Shards are of about one size, so t's share of the split's tokens guesses its shard to within a few
 * (19 at most of the 11,761 shards of 10,000 tokens cut at document ends that bench/scale.py reads); a
 * gallop from the guess brackets it and a binary search ends it. A plain binary search over 11,761 shards
 * took 14 probes, four times a window, and read 0.84-0.86 us a window against 0.52-0.57 at 6 shards of the
 * same tokens (steady, every block checked). Up to 8 shards the search alone takes 3 probes: no guess. */
static Py_ssize_t shard_of(const int64_t *bounds, Py_ssize_t n_shards, int64_t t) {
    Py_ssize_t lo = 0, hi = n_shards;  /* bounds[lo] <= t < bounds[hi] */
    int64_t total = bounds[n_shards];
    if (n_shards > 8 && t >= 0 && t < total) {
        Py_ssize_t g = (Py_ssize_t)((double)t / (double)total * (double)n_shards), step = 1;
        if (g > n_shards - 1) g = n_shards - 1;
        if (bounds[g] <= t) {
            for (lo = g; lo + step < n_shards && bounds[lo + step] <= t; step <<= 1) lo += step;
            hi = lo + step < n_shards ? lo + step : n_shards;
        } else {
            for (hi = g; hi - step > 0 && bounds[hi - step] > t; step <<= 1) hi -= step;
            lo = hi - step > 0 ? hi - step : 0;
        }
    }
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (bounds[mid] <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Whether every shard that window [t, t + length) spans can be read: its descriptor open (fds[i] >= 0)
 * or, with bases, its mapping made (bases[i] != 0); with check, its CRCs loaded (modes[i] == 1). */
static int window_ready(const int64_t *bounds, Py_ssize_t n_shards, int64_t t, int64_t length, const int32_t *fds,
                        const int64_t *bases, const int8_t *modes, int check) {
    for (Py_ssize_t i = shard_of(bounds, n_shards, t); i < n_shards && bounds[i] < t + length; i++)
        if (bounds[i + 1] > bounds[i] && ((bases ? !BASE(&bases[i]) : fds[i] < 0) || (check && modes[i] != 1))) return 0;
    return 1;
}

/* Every mapped window's first PREFETCH_LINES cache lines asked for at once, before the first is
 * copied: the batch's DRAM misses (and their page walks) then overlap instead of each window's
 * copy stalling on its own. Steady reads of 32 x 1,025 tokens, every block checked, 2 GB of
 * shards (1 G tokens): 0.98-1.04 -> 1.22-1.26 G tok/s; 1 line 1.20, 16 lines 1.19, every line
 * 0.97-1.01 (they crowd the L1 before they are used); 24 MB of shards: 1.43-1.52 -> 1.53-1.60. */
#define PREFETCH_LINES 4
static void prefetch_windows(Py_ssize_t n, const int64_t *starts, int itemsize, const int64_t *bounds,
                             Py_ssize_t n_shards, const int64_t *bases) {
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = shard_of(bounds, n_shards, starts[j]);
        int64_t base = BASE(&bases[i]), off = (starts[j] - bounds[i]) * itemsize;
        int64_t end = (bounds[i + 1] - bounds[i]) * itemsize;  /* not past the shard: the window goes on in the next */
        for (int64_t o = off & ~(int64_t)63, k = 0; base && o < end && k < PREFETCH_LINES; o += 64, k++)
            __builtin_prefetch((const char *)(uintptr_t)base + o, 0, 3);
    }
}

/* The walk read_batch and read_mapped share: each window's pieces, shard by shard, read from
 * descriptor fds[i] (read_piece) or, with bases, copied out of the mapping at bases[i] (copy_piece;
 * fds unused). at_window follows the window being read (read_mapped's SIGBUS jump reports it). */
static Py_ssize_t read_batch_nogil(Py_ssize_t n, const int64_t *starts, int64_t length, int itemsize,
                                   const int64_t *bounds, Py_ssize_t n_shards, const int32_t *fds,
                                   const int64_t *bases, const int8_t *modes, const int64_t *file_bytes,
                                   const int64_t *block_base, uint8_t *done, Py_ssize_t n_blocks, const uint32_t *crcs,
                                   char *out, int check, char *span, volatile Py_ssize_t *at_window) {
    for (Py_ssize_t j = 0; j < n; j++)  /* every shard ready first: -2 must leave nothing half done */
        if (!window_ready(bounds, n_shards, starts[j], length, fds, bases, modes, check)) return -2;
    if (bases) prefetch_windows(n, starts, itemsize, bounds, n_shards, bases);
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t t = starts[j], left = length;
        char *dst = out + (size_t)j * (size_t)length * (size_t)itemsize;
        *at_window = j;
        for (Py_ssize_t i = shard_of(bounds, n_shards, t); left > 0; i++) {
            int64_t take = bounds[i + 1] - t < left ? bounds[i + 1] - t : left;
            if (take <= 0) continue;  /* an empty shard */
            int64_t off = (t - bounds[i]) * itemsize, base = bases ? BASE(&bases[i]) : 0;  /* read once: may be retired */
            if (bases ? !base || !copy_piece((const char *)(uintptr_t)base, off, take * itemsize, file_bytes[i],
                                             block_base[i], done, n_blocks, crcs, dst, check)
                      : !read_piece(fds[i], off, take * itemsize, file_bytes[i], block_base[i], done, n_blocks, crcs,
                                    dst, check, span))
                return j;
            dst += take * itemsize;
            t += take;
            left -= take;
        }
    }
    return -1;
}

/* What read_batch and read_mapped check before reading: one handle per shard (handle_bytes each: a
 * descriptor or a mapping's address), modes/sizes/block bases per shard, crcs per block, out large
 * enough, every window inside the split. */
static int batch_args_ok(const Py_buffer *starts, long long length, int itemsize, const Py_buffer *bounds,
                         const Py_buffer *handles, Py_ssize_t handle_bytes, const Py_buffer *modes,
                         const Py_buffer *sizes, const Py_buffer *base, const Py_buffer *done, const Py_buffer *crcs,
                         const Py_buffer *out) {
    Py_ssize_t n = starts->len / 8, n_shards = bounds->len / 8 - 1;
    const int64_t *s = starts->buf, *b = bounds->buf;
    int ok = length > 0 && itemsize > 0 && n_shards > 0 && handles->len == n_shards * handle_bytes
             && modes->len == n_shards && sizes->len == n_shards * 8 && base->len >= n_shards * 8
             && crcs->len == done->len * 4 && out->len >= n * length * itemsize && b[0] == 0;
    for (Py_ssize_t j = 0; ok && j < n; j++) ok = s[j] >= 0 && s[j] + length <= b[n_shards];
    return ok;
}

static PyObject *read_batch(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer starts, bounds, fds, modes, sizes, base, done, crcs, out;
    long long length;
    int itemsize, check;
    if (!PyArg_ParseTuple(args, "y*Liy*y*y*y*y*w*y*w*p", &starts, &length, &itemsize, &bounds, &fds, &modes, &sizes,
                          &base, &done, &crcs, &out, &check))
        return NULL;
    Py_ssize_t n = starts.len / 8, n_shards = bounds.len / 8 - 1, failed = -3;
    const int64_t *s = starts.buf, *b = bounds.buf;
    int ok = batch_args_ok(&starts, length, itemsize, &bounds, &fds, 4, &modes, &sizes, &base, &done, &crcs, &out);
    char *span = ok ? malloc((size_t)(length * itemsize) + 2 * BLOCK) : NULL;
    if (span) {
        Py_BEGIN_ALLOW_THREADS
        volatile Py_ssize_t at_window = 0;
        failed = read_batch_nogil(n, s, (int64_t)length, itemsize, b, n_shards, fds.buf, NULL, modes.buf, sizes.buf,
                                  base.buf, done.buf, done.len, crcs.buf, out.buf, check, span, &at_window);
        Py_END_ALLOW_THREADS
        free(span);
    }
    PyBuffer_Release(&starts); PyBuffer_Release(&bounds); PyBuffer_Release(&fds); PyBuffer_Release(&modes);
    PyBuffer_Release(&sizes); PyBuffer_Release(&base); PyBuffer_Release(&done); PyBuffer_Release(&crcs);
    PyBuffer_Release(&out);
    if (failed == -3) {
        if (ok) return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError, "read_batch: arrays of different lengths, a window outside the split, "
                                          "or done/crcs/out too small");
        return NULL;
    }
    return PyLong_FromSsize_t(failed);
}
