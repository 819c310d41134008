/* _fastbpe: the compiled encoding loop of lmdata.tokenizer.encoder (plain CPython C API).
 *
 * Encoder(merges, byte_ids, pretokenize, cache_entries, max_cached_chunk) holds
 *   - the merge table: an open-addressing hash (left_id, right_id) -> (rank, merged id);
 *   - the byte -> id table (identity for our vocabs, a permutation for GPT-2's);
 *   - a chunk cache: chunk code points -> ids, in C (no str object per chunk);
 *   - pretokenize: the GPT-2 regex's findall, called only for a new chunk holding a
 *     non-ASCII character (ASCII chunks are pre-tokenized here, same rules, see below).
 * encode(text) cuts text into chunks exactly as pretokenize.split_pieces does (before a
 * " " followed by a character that is not str.isspace()), looks each chunk up in the cache,
 * and on a miss pre-tokenizes it and runs BPE on each pre-token.  bpe(bytes) is one
 * pre-token.  BPE: a linked list plus a binary min-heap of (rank, position); all pairs of the
 * lowest rank are merged left to right as one step (= str.replace of the best pair), so a
 * 1 MB pre-token costs O(n log n).  The Python encoder is the reference this must equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct { uint64_t key; int32_t rank; int32_t merged; } MergeSlot;  /* key 0 = empty */

typedef struct Entry {
    uint64_t hash;
    int32_t nchars, nids;
    int32_t data[];  /* nchars code points, then nids ids */
} Entry;

typedef struct {
    PyObject_HEAD
    MergeSlot *merges;
    uint64_t merge_mask;
    int32_t byte_ids[256];
    PyObject *pretokenize;
    PyObject **id_objs;  /* id -> int object, so the output list shares them */
    Py_ssize_t n_ids;
    Entry **cache;
    uint64_t cache_mask;
    Py_ssize_t cache_used, cache_limit, max_cached_chunk;
} Encoder;

/* ---------------------------------------------------------------- growable id buffer */

typedef struct { int32_t *v; Py_ssize_t n, cap; } IdBuf;

static int buf_reserve(IdBuf *b, Py_ssize_t extra) {
    if (b->n + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + extra) cap *= 2;
    int32_t *v = PyMem_Realloc(b->v, (size_t)cap * sizeof(int32_t));
    if (!v) { PyErr_NoMemory(); return -1; }
    b->v = v; b->cap = cap;
    return 0;
}

/* ---------------------------------------------------------------- merge table */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}

static inline uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static inline const MergeSlot *merge_find(const Encoder *e, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b), i = mix64(key) & e->merge_mask;
    for (;;) {
        const MergeSlot *s = &e->merges[i];
        if (s->key == key) return s;
        if (s->key == 0) return NULL;
        i = (i + 1) & e->merge_mask;
    }
}

/* ---------------------------------------------------------------- BPE of one pre-token */

typedef struct { uint64_t *v; Py_ssize_t n; } Heap;  /* entries: rank << 32 | position */

static inline void heap_push(Heap *h, uint64_t x) {
    Py_ssize_t i = h->n++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (h->v[p] <= x) break;
        h->v[i] = h->v[p]; i = p;
    }
    h->v[i] = x;
}

static inline uint64_t heap_pop(Heap *h) {
    uint64_t top = h->v[0], x = h->v[--h->n];
    Py_ssize_t i = 0, n = h->n;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h->v[c + 1] < h->v[c]) c++;
        if (x <= h->v[c]) break;
        h->v[i] = h->v[c]; i = c;
    }
    if (n) h->v[i] = x;
    return top;
}

/* Append the BPE ids of the UTF-8 bytes s[0:n] to out. */
static int bpe_bytes(Encoder *e, const unsigned char *s, Py_ssize_t n, IdBuf *out) {
    if (n == 0) return 0;
    if (n >= 0x7fffffff) {  /* positions are 32-bit in the heap entries */
        PyErr_SetString(PyExc_ValueError, "a single pre-token of 2 GiB or more cannot be encoded");
        return -1;
    }
    if (n == 1) {
        if (buf_reserve(out, 1) < 0) return -1;
        out->v[out->n++] = e->byte_ids[s[0]];
        return 0;
    }
    /* one block: sym, nxt, prv (int32 each), heap (uint64, at most n - 1 + 2 per merge) */
    enum { SMALL = 64 };
    int32_t small_sym[SMALL], small_nxt[SMALL], small_prv[SMALL];
    uint64_t small_heap[3 * SMALL];
    int32_t *sym = small_sym, *nxt = small_nxt, *prv = small_prv;
    uint64_t *heapv = small_heap, *pending = NULL;
    void *block = NULL;
    if (n > SMALL) {
        /* heap holds at most (n - 1) + 2 * merges <= 3n entries; pending at most 2n */
        block = PyMem_Malloc((size_t)n * (3 * sizeof(int32_t) + 5 * sizeof(uint64_t)));
        if (!block) { PyErr_NoMemory(); return -1; }
        heapv = (uint64_t *)block;
        pending = heapv + 3 * n;
        sym = (int32_t *)(pending + 2 * n);
        nxt = sym + n; prv = nxt + n;
    }
    uint64_t small_pending[2 * SMALL];
    if (!pending) pending = small_pending;
    Heap h = {heapv, 0};
    for (Py_ssize_t i = 0; i < n; i++) { sym[i] = e->byte_ids[s[i]]; nxt[i] = (int32_t)i + 1; prv[i] = (int32_t)i - 1; }
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        const MergeSlot *m = merge_find(e, sym[i], sym[i + 1]);
        if (m) heap_push(&h, (uint64_t)m->rank << 32 | (uint64_t)i);
    }
    while (h.n) {
        uint32_t rank = (uint32_t)(h.v[0] >> 32);
        Py_ssize_t np = 0;
        /* every entry of this rank, in position order, before any pair the merges create */
        while (h.n && (uint32_t)(h.v[0] >> 32) == rank) {
            uint64_t top = heap_pop(&h);
            int32_t i = (int32_t)(top & 0xffffffffu), j;
            if (sym[i] < 0 || (j = nxt[i]) >= n) continue;  /* merged away / no right neighbour */
            const MergeSlot *m = merge_find(e, sym[i], sym[j]);
            if (!m || (uint32_t)m->rank != rank) continue;  /* stale: a neighbour changed */
            sym[i] = m->merged;
            sym[j] = -1;
            int32_t k = nxt[j];
            nxt[i] = k;
            if (k < n) prv[k] = i;
            if (prv[i] >= 0) pending[np++] = (uint64_t)(uint32_t)prv[i];
            if (k < n) pending[np++] = (uint64_t)(uint32_t)i;
        }
        for (Py_ssize_t q = 0; q < np; q++) {  /* pairs that start at these positions, now */
            int32_t p = (int32_t)pending[q], r;
            if (sym[p] < 0 || (r = nxt[p]) >= n) continue;
            const MergeSlot *m = merge_find(e, sym[p], sym[r]);
            if (m) heap_push(&h, (uint64_t)m->rank << 32 | (uint64_t)(uint32_t)p);
        }
    }
    int rc = buf_reserve(out, n);
    if (rc == 0)
        for (Py_ssize_t i = 0; i < n; i = nxt[i]) out->v[out->n++] = sym[i];
    PyMem_Free(block);
    return rc;
}

/* ---------------------------------------------------------------- pre-tokenizing */

/* regex's \s, \p{L}, \p{N} on ASCII (U+001C..U+001F are not \s for `regex`, unlike isspace) */
#define A_SPACE 1
#define A_LETTER 2
#define A_DIGIT 3
#define A_OTHER 4
static unsigned char ascii_class[128];

static void init_ascii_class(void) {
    for (int c = 0; c < 128; c++) {
        unsigned char k = A_OTHER;
        if (c == ' ' || (c >= 9 && c <= 13)) k = A_SPACE;
        else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) k = A_LETTER;
        else if (c >= '0' && c <= '9') k = A_DIGIT;
        ascii_class[c] = k;
    }
}

/* Length of the GPT-2 pattern's match at s[i] (ASCII, n > i), the pattern being
 * '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  */
static Py_ssize_t ascii_match(const unsigned char *s, Py_ssize_t i, Py_ssize_t n) {
    unsigned char c = s[i];
    if (c == '\'' && i + 1 < n) {
        unsigned char d = s[i + 1];
        if (d == 's' || d == 'd' || d == 'm' || d == 't') return 2;
        if (i + 2 < n) {
            unsigned char f = s[i + 2];
            if ((d == 'l' && f == 'l') || (d == 'v' && f == 'e') || (d == 'r' && f == 'e')) return 3;
        }
    }
    Py_ssize_t j = i;
    if (c == ' ' && i + 1 < n && ascii_class[s[i + 1]] != A_SPACE) j = i + 1;
    unsigned char k = ascii_class[s[j]];
    if (k != A_SPACE) {  /* one of the three ' ?X+' alternatives */
        j++;
        while (j < n && ascii_class[s[j]] == k) j++;
        return j - i;
    }
    j = i;
    while (j < n && ascii_class[s[j]] == A_SPACE) j++;
    if (j == n || j - i == 1) return j - i;  /* \s+ to the end, or a single \s */
    return j - i - 1;  /* leave the last space to the next match's ' ?' */
}

/* Append the ids of one chunk (code points c[0:n]) to out. */
static int encode_chunk(Encoder *e, PyObject *text, Py_ssize_t start, Py_ssize_t n, const Py_UCS4 *c, IdBuf *out) {
    int ascii = 1;
    for (Py_ssize_t i = 0; i < n; i++) if (c[i] >= 128) { ascii = 0; break; }
    if (ascii) {
        unsigned char small[256], *s = small;
        if (n > (Py_ssize_t)sizeof(small)) {
            s = PyMem_Malloc((size_t)n);
            if (!s) { PyErr_NoMemory(); return -1; }
        }
        for (Py_ssize_t i = 0; i < n; i++) s[i] = (unsigned char)c[i];
        int rc = 0;
        for (Py_ssize_t i = 0; i < n && rc == 0;) {
            Py_ssize_t len = ascii_match(s, i, n);
            rc = bpe_bytes(e, s + i, len, out);
            i += len;
        }
        if (s != small) PyMem_Free(s);
        return rc;
    }
    PyObject *chunk = PyUnicode_Substring(text, start, start + n);
    if (!chunk) return -1;
    PyObject *words = PyObject_CallOneArg(e->pretokenize, chunk);
    Py_DECREF(chunk);
    if (!words) return -1;
    if (!PyList_Check(words)) {
        Py_DECREF(words);
        PyErr_SetString(PyExc_TypeError, "pretokenize must return a list of str");
        return -1;
    }
    for (Py_ssize_t w = 0; w < PyList_GET_SIZE(words); w++) {
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(words, w), &len);
        if (!u || bpe_bytes(e, (const unsigned char *)u, len, out) < 0) { Py_DECREF(words); return -1; }
    }
    Py_DECREF(words);
    return 0;
}

/* ---------------------------------------------------------------- chunk cache */

static void cache_clear(Encoder *e) {
    if (!e->cache) return;
    for (uint64_t i = 0; i <= e->cache_mask; i++) { PyMem_Free(e->cache[i]); e->cache[i] = NULL; }
    e->cache_used = 0;
}

static inline int entry_equal(const Entry *x, uint64_t hash, const Py_UCS4 *c, Py_ssize_t n) {
    if (x->hash != hash || x->nchars != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++) if ((Py_UCS4)x->data[i] != c[i]) return 0;
    return 1;
}

/* Encode text[start:start+n] (code points in c) through the cache. */
static int encode_cached(Encoder *e, PyObject *text, Py_ssize_t start, Py_ssize_t n, const Py_UCS4 *c,
                         uint64_t hash, IdBuf *out) {
    if (n > e->max_cached_chunk) return encode_chunk(e, text, start, n, c, out);
    uint64_t i = hash & e->cache_mask;
    for (Entry *x; (x = e->cache[i]) != NULL; i = (i + 1) & e->cache_mask) {
        if (entry_equal(x, hash, c, n)) {
            if (buf_reserve(out, x->nids) < 0) return -1;
            memcpy(out->v + out->n, x->data + n, (size_t)x->nids * sizeof(int32_t));
            out->n += x->nids;
            return 0;
        }
    }
    Py_ssize_t before = out->n;
    if (encode_chunk(e, text, start, n, c, out) < 0) return -1;
    Py_ssize_t nids = out->n - before;
    if (e->cache_used >= e->cache_limit) cache_clear(e);
    /* probe again: the pretokenize call ran Python code, which may have used this cache */
    for (i = hash & e->cache_mask; e->cache[i]; i = (i + 1) & e->cache_mask)
        if (entry_equal(e->cache[i], hash, c, n)) return 0;
    Entry *x = PyMem_Malloc(sizeof(Entry) + (size_t)(n + nids) * sizeof(int32_t));
    if (!x) { PyErr_NoMemory(); return -1; }
    x->hash = hash; x->nchars = (int32_t)n; x->nids = (int32_t)nids;
    for (Py_ssize_t k = 0; k < n; k++) x->data[k] = (int32_t)c[k];
    memcpy(x->data + n, out->v + before, (size_t)nids * sizeof(int32_t));
    e->cache[i] = x;
    e->cache_used++;
    return 0;
}

/* ---------------------------------------------------------------- Encoder methods */

static PyObject *ids_to_list(Encoder *e, const IdBuf *b) {
    PyObject *list = PyList_New(b->n);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *o = e->id_objs[b->v[i]];
        Py_INCREF(o);
        PyList_SET_ITEM(list, i, o);
    }
    return list;
}

#define CHUNK_LOOP(TYPE)                                                                         \
    do {                                                                                         \
        const TYPE *d = (const TYPE *)data;                                                      \
        Py_ssize_t start = 0;                                                                    \
        while (start < len) {                                                                    \
            Py_ssize_t i = start, m = 0;                                                         \
            uint64_t hash = 0xcbf29ce484222325ULL;                                               \
            for (;;) {                                                                           \
                Py_UCS4 ch = d[i];                                                               \
                if (m == cap) {                                                                  \
                    Py_UCS4 *bigger = PyMem_Realloc(cp == small ? NULL : cp, 2 * cap * sizeof(Py_UCS4)); \
                    if (!bigger) { PyErr_NoMemory(); goto fail; }                                \
                    if (cp == small) memcpy(bigger, small, sizeof(small));                       \
                    cp = bigger; cap *= 2;                                                       \
                }                                                                                \
                cp[m++] = ch;                                                                    \
                hash = (hash ^ ch) * 0x100000001b3ULL;                                           \
                i++;                                                                             \
                if (i >= len) break;                                                             \
                if (d[i] == ' ' && i + 1 < len && !Py_UNICODE_ISSPACE(d[i + 1])) break;          \
            }                                                                                    \
            if (encode_cached(e, text, start, m, cp, mix64(hash), &out) < 0) goto fail;          \
            start = i;                                                                           \
        }                                                                                        \
    } while (0)

static PyObject *Encoder_encode(Encoder *e, PyObject *text) {
    if (!PyUnicode_Check(text)) { PyErr_SetString(PyExc_TypeError, "encode() takes a str"); return NULL; }
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    IdBuf out = {NULL, 0, 0};
    Py_UCS4 small[256], *cp = small;
    Py_ssize_t cap = 256;
    PyObject *result = NULL;
    if (kind == PyUnicode_1BYTE_KIND) CHUNK_LOOP(Py_UCS1);
    else if (kind == PyUnicode_2BYTE_KIND) CHUNK_LOOP(Py_UCS2);
    else CHUNK_LOOP(Py_UCS4);
    result = ids_to_list(e, &out);
fail:
    if (cp != small) PyMem_Free(cp);
    PyMem_Free(out.v);
    return result;
}

static PyObject *Encoder_bpe(Encoder *e, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    IdBuf out = {NULL, 0, 0};
    PyObject *result = NULL;
    if (bpe_bytes(e, view.buf, view.len, &out) == 0) result = ids_to_list(e, &out);
    PyBuffer_Release(&view);
    PyMem_Free(out.v);
    return result;
}

static PyObject *Encoder_clear(Encoder *e, PyObject *Py_UNUSED(ignored)) {
    cache_clear(e);
    Py_RETURN_NONE;
}

static PyObject *Encoder_cached(Encoder *e, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSsize_t(e->cache_used);
}

static int Encoder_init(Encoder *e, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"merges", "byte_ids", "pretokenize", "cache_entries", "max_cached_chunk", NULL};
    PyObject *merges, *byte_ids, *pretokenize;
    Py_ssize_t cache_entries = 1 << 19, max_cached = 128;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|nn", kwlist, &merges, &byte_ids, &pretokenize,
                                     &cache_entries, &max_cached))
        return -1;
    if (e->merges) { PyErr_SetString(PyExc_RuntimeError, "Encoder is already initialised"); return -1; }
    PyObject *seq = PySequence_Fast(merges, "merges must be a sequence of (left, right, merged) ids");
    if (!seq) return -1;
    Py_ssize_t nm = PySequence_Fast_GET_SIZE(seq);
    int32_t max_id = 255;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)nm + 1) size *= 2;
    e->merges = PyMem_Calloc(size, sizeof(MergeSlot));
    e->merge_mask = size - 1;
    if (!e->merges) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t r = 0; r < nm; r++) {
        int a, b, m;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, r), "iii", &a, &b, &m)) { Py_DECREF(seq); return -1; }
        if (a < 0 || b < 0 || m < 0) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "negative id"); return -1; }
        max_id = a > max_id ? a : max_id; max_id = b > max_id ? b : max_id; max_id = m > max_id ? m : max_id;
        uint64_t key = pair_key(a, b), i = mix64(key) & e->merge_mask;
        while (e->merges[i].key && e->merges[i].key != key) i = (i + 1) & e->merge_mask;
        if (e->merges[i].key == 0) {  /* a repeated merge keeps its first rank */
            e->merges[i].key = key; e->merges[i].rank = (int32_t)r; e->merges[i].merged = m;
        }
    }
    Py_DECREF(seq);
    seq = PySequence_Fast(byte_ids, "byte_ids must be a sequence of 256 ids");
    if (!seq) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != 256) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "byte_ids needs 256 ids"); return -1; }
    for (int b = 0; b < 256; b++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, b));
        if (v < 0 || v > 0x7fffffff) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "byte id out of range");
            return -1;
        }
        e->byte_ids[b] = (int32_t)v;
        max_id = (int32_t)v > max_id ? (int32_t)v : max_id;
    }
    Py_DECREF(seq);
    e->n_ids = (Py_ssize_t)max_id + 1;
    e->id_objs = PyMem_Calloc((size_t)e->n_ids, sizeof(PyObject *));
    if (!e->id_objs) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < e->n_ids; i++)
        if (!(e->id_objs[i] = PyLong_FromSsize_t(i))) return -1;
    Py_INCREF(pretokenize);
    e->pretokenize = pretokenize;
    if (cache_entries < 1) cache_entries = 1;
    e->cache_limit = cache_entries;
    e->max_cached_chunk = max_cached;
    size = 16;
    while (size < 2 * (uint64_t)cache_entries) size *= 2;
    e->cache = PyMem_Calloc(size, sizeof(Entry *));
    if (!e->cache) { PyErr_NoMemory(); return -1; }
    e->cache_mask = size - 1;
    return 0;
}

static void Encoder_dealloc(Encoder *e) {
    cache_clear(e);
    PyMem_Free(e->cache);
    PyMem_Free(e->merges);
    if (e->id_objs) {
        for (Py_ssize_t i = 0; i < e->n_ids; i++) Py_XDECREF(e->id_objs[i]);
        PyMem_Free(e->id_objs);
    }
    Py_XDECREF(e->pretokenize);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *Encoder_ready(Encoder *e, PyObject *(*f)(Encoder *, PyObject *), PyObject *arg) {
    if (!e->merges || !e->id_objs || !e->cache) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder was not initialised");
        return NULL;
    }
    return f(e, arg);
}

static PyObject *m_encode(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_encode, arg); }
static PyObject *m_bpe(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_bpe, arg); }

static PyMethodDef Encoder_methods[] = {
    {"encode", m_encode, METH_O, "encode(text: str) -> list[int]: ids of text holding no special tokens."},
    {"bpe", m_bpe, METH_O, "bpe(pretoken: bytes) -> list[int]: BPE of one pre-token's UTF-8 bytes."},
    {"clear", (PyCFunction)Encoder_clear, METH_NOARGS, "Empty the chunk cache."},
    {"cached", (PyCFunction)Encoder_cached, METH_NOARGS, "Number of chunks in the cache."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmdata.tokenizer._fastbpe.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encoder(merges, byte_ids, pretokenize, cache_entries=524288, max_cached_chunk=128)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = Encoder_methods,
};

static struct PyModuleDef fastbpe_module = {
    PyModuleDef_HEAD_INIT, "_fastbpe", "Compiled BPE encoding loop for lmdata.tokenizer.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastbpe(void) {
    init_ascii_class();
    if (PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fastbpe_module);
    if (!m) return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
