/* _fastbpe_train.c: the compiled BPE trainer, #included by _fastbpe.c (one translation unit:
 * it shares the pattern matchers, mix64 and the error codes).  Built by setup.py with it.
 *
 * ChunkCounter(mode, program=None): a table of distinct chunks (code points -> count).
 *   add(segments) cuts each str exactly as the encoder does (CHUNK_LOOP: before a " " followed
 *   by a non-space; cl100k also after a non-space; mode 3: the Program's pre-tokens, which
 *   train() then takes whole) and counts each chunk, with the GIL released.
 *   One counter per thread; absorb(other) adds another's counts (then empties it).
 * train(counter, pretokens, num_merges) -> (merges, distinct_pretokens, table_bytes):
 *   pre-tokenizes every distinct chunk once (C matchers), adds the optional dict
 *   {pretoken str: count} (a custom regex counted in Python), then runs the merge loop:
 *   words are int32 symbol arrays, merged in place; pair counts live in an open-addressing
 *   table (a, b) -> pair, each pair with the list of words that hold it (maybe stale); a
 *   binary max-heap of (count, pair) with lazy updates picks the best pair: the greatest
 *   count, ties to the greater (bytes_a, bytes_b).  Counts of existing pairs only fall
 *   (every pair a merge creates holds the new token), so a stale entry is re-keyed with
 *   its current count when it surfaces.  The result depends only on the multiset of
 *   (pre-token, count): never on thread count or the order of the tables.
 */

/* ---------------------------------------------------------------- code point tables */

typedef struct { uint64_t hash; int64_t count; size_t off; Py_ssize_t len; } CEntry;

typedef struct {
    CEntry *ents; Py_ssize_t n, cap;
    int32_t *index; uint64_t mask;  /* -1: empty */
    uint32_t *arena; size_t an, acap;
} CTable;

#define FNV_OFF 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static int ct_init(CTable *t) {
    memset(t, 0, sizeof(*t));
    t->mask = 1023;
    t->index = PyMem_RawMalloc(1024 * sizeof(int32_t));
    if (!t->index) return ERR_NOMEM;
    memset(t->index, 0xff, 1024 * sizeof(int32_t));
    return 0;
}

static void ct_free(CTable *t) {
    PyMem_RawFree(t->ents); PyMem_RawFree(t->index); PyMem_RawFree(t->arena);
    memset(t, 0, sizeof(*t));
}

static size_t ct_bytes(const CTable *t) {
    return (size_t)t->cap * sizeof(CEntry) + (t->mask + 1) * sizeof(int32_t) + t->acap * sizeof(uint32_t);
}

static int ct_rehash(CTable *t) {
    uint64_t size = 2 * (t->mask + 1);
    if (size > ((uint64_t)1 << 31)) return ERR_BIG;
    int32_t *index = PyMem_RawMalloc((size_t)size * sizeof(int32_t));
    if (!index) return ERR_NOMEM;
    memset(index, 0xff, (size_t)size * sizeof(int32_t));
    uint64_t mask = size - 1;
    for (Py_ssize_t k = 0; k < t->n; k++) {
        uint64_t i = t->ents[k].hash & mask;
        while (index[i] >= 0) i = (i + 1) & mask;
        index[i] = (int32_t)k;
    }
    PyMem_RawFree(t->index);
    t->index = index; t->mask = mask;
    return 0;
}

/* a new entry at index slot i; the key is copied by the caller into arena[off:off+len] */
static int ct_new_entry(CTable *t, uint64_t i, uint64_t hash, int64_t count, Py_ssize_t len, size_t *off) {
    if (t->n == t->cap) {
        Py_ssize_t cap = t->cap ? 2 * t->cap : 1024;
        CEntry *ents = PyMem_RawRealloc(t->ents, (size_t)cap * sizeof(CEntry));
        if (!ents) return ERR_NOMEM;
        t->ents = ents; t->cap = cap;
    }
    if (t->an + (size_t)len > t->acap) {
        size_t cap = t->acap ? 2 * t->acap : 1 << 14;
        while (cap < t->an + (size_t)len) cap *= 2;
        uint32_t *arena = PyMem_RawRealloc(t->arena, cap * sizeof(uint32_t));
        if (!arena) return ERR_NOMEM;
        t->arena = arena; t->acap = cap;
    }
    CEntry *e = &t->ents[t->n];
    e->hash = hash; e->count = count; e->off = t->an; e->len = len;
    *off = t->an;
    t->an += (size_t)len;
    t->index[i] = (int32_t)t->n++;
    if (2 * (uint64_t)t->n > t->mask + 1) return ct_rehash(t);
    return 0;
}

#define CT_ADD(TYPE, NAME)                                                                        \
    static int NAME(CTable *t, const TYPE *d, Py_ssize_t len, uint64_t hash, int64_t count) {     \
        uint64_t i = hash & t->mask;                                                              \
        for (int32_t k; (k = t->index[i]) >= 0; i = (i + 1) & t->mask) {                          \
            CEntry *e = &t->ents[k];                                                              \
            if (e->hash != hash || e->len != len) continue;                                       \
            const uint32_t *s = t->arena + e->off;                                                \
            Py_ssize_t q = 0;                                                                     \
            while (q < len && s[q] == (uint32_t)d[q]) q++;                                        \
            if (q == len) { e->count += count; return 0; }                                        \
        }                                                                                         \
        size_t off;                                                                               \
        uint32_t *dst;                                                                            \
        /* copy first: ct_new_entry may rehash, but the arena slot is fixed by then */           \
        int rc = ct_new_entry(t, i, hash, count, len, &off);                                      \
        if (rc == ERR_NOMEM) return rc;                                                           \
        dst = t->arena + off;                                                                     \
        for (Py_ssize_t q = 0; q < len; q++) dst[q] = (uint32_t)d[q];                             \
        return rc;                                                                                \
    }
CT_ADD(Py_UCS1, ct_add1)
CT_ADD(Py_UCS2, ct_add2)
CT_ADD(Py_UCS4, ct_add4)

static inline uint64_t cp_hash(const uint32_t *s, Py_ssize_t n) {
    uint64_t h = FNV_OFF;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ s[i]) * FNV_PRIME;
    return mix64(h);
}

/* ---------------------------------------------------------------- ChunkCounter */

typedef struct {
    PyObject_HEAD
    CTable t;
    int mode, busy;
    int64_t chunks;  /* chunks counted, repeats included */
    PyObject *program; const Prog *prog;  /* mode 3: the Program, whose pre-tokens are the "chunks" */
} ChunkCounter;

#define COUNT_LOOP(TYPE, ADD)                                                                     \
    do {                                                                                          \
        const TYPE *d = (const TYPE *)data;                                                       \
        Py_ssize_t start = 0;                                                                     \
        while (start < len && rc == 0) {                                                          \
            Py_ssize_t i = start;                                                                 \
            uint64_t h = FNV_OFF;                                                                 \
            for (;;) {                                                                            \
                h = (h ^ (uint32_t)d[i]) * FNV_PRIME;                                             \
                i++;                                                                              \
                if (i >= len) break;                                                              \
                if (d[i] == ' ' && i + 1 < len && !Py_UNICODE_ISSPACE(d[i + 1])                   \
                    && (!strict || !Py_UNICODE_ISSPACE(d[i - 1]))) break;                         \
            }                                                                                     \
            rc = ADD(t, d + start, i - start, mix64(h), 1);                                       \
            n_chunks++;                                                                           \
            start = i;                                                                            \
        }                                                                                         \
    } while (0)

static int count_text(CTable *t, int strict, int kind, const void *data, Py_ssize_t len, int64_t *chunks) {
    int rc = 0;
    int64_t n_chunks = 0;
    if (kind == PyUnicode_1BYTE_KIND) COUNT_LOOP(Py_UCS1, ct_add1);
    else if (kind == PyUnicode_2BYTE_KIND) COUNT_LOOP(Py_UCS2, ct_add2);
    else COUNT_LOOP(Py_UCS4, ct_add4);
    *chunks += n_chunks;
    return rc;
}

/* count_text for a Program: each pre-token counted as one "chunk" */
static int count_text_prog(CTable *t, const Prog *p, int kind, const void *data, Py_ssize_t len, int64_t *chunks) {
    Py_UCS4 small[1024], *cp = small;
    Py_ssize_t cap = 1024;
    int rc = to_ucs4(kind, data, len, &cp, &cap, small), chain = p->nsteps > 1;
    Ends ends = {NULL, 0, 0};  /* a chain: every piece's end, first */
    Py_ssize_t next = 0;
    if (rc == 0 && chain) rc = chain_split(p, 0, cp, 0, len, &ends);
    for (Py_ssize_t i = 0; i < len && rc == 0;) {
        Py_ssize_t m = chain ? ends.v[next++] - i : prog_match(p, cp, i, len);
        if (m < 0) { rc = (int)m; break; }
        rc = ct_add4(t, cp + i, m, cp_hash(cp + i, m), 1);
        ++*chunks;
        i += m;
    }
    if (cp != small) PyMem_RawFree(cp);
    PyMem_RawFree(ends.v);
    return rc;
}

static int ChunkCounter_init(ChunkCounter *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"mode", "program", NULL};
    int mode;
    PyObject *program = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|O", kwlist, &mode, &program)) return -1;
    if (mode < 0 || mode > 3) { PyErr_SetString(PyExc_ValueError, "mode must be 0, 1, 2 or 3"); return -1; }
    if ((mode == 3) != PyObject_TypeCheck(program, &ProgramType) || (mode == 3 && !((ProgramObject *)program)->p.code)) {
        PyErr_SetString(PyExc_ValueError, "mode 3 takes an initialised Program (program=), other modes none");
        return -1;
    }
    if (mode < 3 && !uclass) { PyErr_SetString(PyExc_RuntimeError, "call set_classes() first"); return -1; }
    if (c->t.index) { PyErr_SetString(PyExc_RuntimeError, "ChunkCounter is already initialised"); return -1; }
    if (ct_init(&c->t) < 0) { PyErr_NoMemory(); return -1; }
    c->mode = mode;
    if (mode == 3) { Py_INCREF(program); c->program = program; c->prog = &((ProgramObject *)program)->p; }
    return 0;
}

static void ChunkCounter_dealloc(ChunkCounter *c) {
    ct_free(&c->t);
    Py_XDECREF(c->program);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int counter_ready(ChunkCounter *c) {
    if (!c->t.index) { PyErr_SetString(PyExc_RuntimeError, "ChunkCounter was not initialised"); return -1; }
    if (c->busy) { PyErr_SetString(PyExc_RuntimeError, "ChunkCounter is in use by another thread"); return -1; }
    return 0;
}

/* add(segments): count the chunks of every str, GIL released (segments is held by the tuple) */
static PyObject *ChunkCounter_add(ChunkCounter *c, PyObject *arg) {
    if (counter_ready(c) < 0) return NULL;
    PyObject *seq = PySequence_Tuple(arg);
    if (!seq) return NULL;
    Py_ssize_t nt = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t k = 0; k < nt; k++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(seq, k))) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "add() takes a sequence of str");
            return NULL;
        }
    int rc = 0, strict = c->mode == 1;
    c->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < nt && rc == 0; k++) {
        PyObject *s = PyTuple_GET_ITEM(seq, k);
        if (c->mode == 3)
            rc = count_text_prog(&c->t, c->prog, PyUnicode_KIND(s), PyUnicode_DATA(s), PyUnicode_GET_LENGTH(s), &c->chunks);
        else
            rc = count_text(&c->t, strict, PyUnicode_KIND(s), PyUnicode_DATA(s), PyUnicode_GET_LENGTH(s), &c->chunks);
    }
    Py_END_ALLOW_THREADS
    c->busy = 0;
    Py_DECREF(seq);
    if (rc < 0) return raise_err(rc), NULL;
    Py_RETURN_NONE;
}

static PyTypeObject ChunkCounterType;

/* absorb(other): add other's counts into this one and empty other */
static PyObject *ChunkCounter_absorb(ChunkCounter *c, PyObject *arg) {
    if (!PyObject_TypeCheck(arg, &ChunkCounterType)) { PyErr_SetString(PyExc_TypeError, "absorb() takes a ChunkCounter"); return NULL; }
    ChunkCounter *o = (ChunkCounter *)arg;
    if (o == c) { PyErr_SetString(PyExc_ValueError, "a counter cannot absorb itself"); return NULL; }
    if (counter_ready(c) < 0 || counter_ready(o) < 0) return NULL;
    if (o->mode != c->mode || o->prog != c->prog) { PyErr_SetString(PyExc_ValueError, "counters of different patterns"); return NULL; }
    int rc = 0;
    c->busy = o->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < o->t.n && rc == 0; k++) {
        const CEntry *e = &o->t.ents[k];
        rc = ct_add4(&c->t, o->t.arena + e->off, e->len, e->hash, e->count);
    }
    Py_END_ALLOW_THREADS
    c->busy = o->busy = 0;
    if (rc < 0) return raise_err(rc), NULL;
    c->chunks += o->chunks;
    ct_free(&o->t);
    o->chunks = 0;
    if (ct_init(&o->t) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *ChunkCounter_stats(ChunkCounter *c, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{s:n,s:L,s:n}", "distinct", c->t.n, "chunks", (long long)c->chunks,
                         "table_bytes", (Py_ssize_t)ct_bytes(&c->t));
}

static PyObject *ChunkCounter_items(ChunkCounter *c, PyObject *Py_UNUSED(ignored)) {
    PyObject *d = PyDict_New();
    for (Py_ssize_t k = 0; d && k < c->t.n; k++) {
        const CEntry *e = &c->t.ents[k];
        PyObject *key = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, c->t.arena + e->off, e->len);
        PyObject *val = key ? PyLong_FromLongLong(e->count) : NULL;
        if (!val || PyDict_SetItem(d, key, val) < 0) Py_CLEAR(d);
        Py_XDECREF(key); Py_XDECREF(val);
    }
    return d;
}

static PyMethodDef ChunkCounter_methods[] = {
    {"add", (PyCFunction)ChunkCounter_add, METH_O, "add(segments): count the chunks of each str (GIL released)."},
    {"absorb", (PyCFunction)ChunkCounter_absorb, METH_O, "absorb(other): add other's counts, then empty it."},
    {"stats", (PyCFunction)ChunkCounter_stats, METH_NOARGS, "{'distinct', 'chunks', 'table_bytes'}"},
    {"items", (PyCFunction)ChunkCounter_items, METH_NOARGS, "{chunk: count} (tests)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ChunkCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmdata.tokenizer._fastbpe.ChunkCounter",
    .tp_basicsize = sizeof(ChunkCounter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ChunkCounter(mode, program=None): distinct chunks of text and their counts (0 gpt2, 1 cl100k, 2 o200k, "
               "3 the Program's pre-tokens).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ChunkCounter_init,
    .tp_dealloc = (destructor)ChunkCounter_dealloc,
    .tp_methods = ChunkCounter_methods,
};

/* ---------------------------------------------------------------- the merge loop */

typedef struct { int32_t a, b; int64_t count; int32_t *occ; int32_t nocc, capocc; int32_t stamp; } Pair;
typedef struct { int64_t count; int32_t pair; } HeapItem;

typedef struct {
    /* words */
    int32_t *sym; size_t *woff; int32_t *wlen; int64_t *wfreq; int32_t *wstamp; Py_ssize_t nw;
    /* pairs */
    Pair *pairs; Py_ssize_t np, capp;
    uint64_t *pkeys; int32_t *pidx; uint64_t pmask;  /* open addressing: key (a, b) + 1 -> pair */
    /* heap */
    HeapItem *heap; Py_ssize_t nh, caph;
    /* token bytes */
    unsigned char *tb; size_t tbn, tbcap; size_t *toff; int32_t *tlen;
    int32_t *gained; Py_ssize_t ngained, capgained;
} Trainer;

static int pair_rehash(Trainer *T) {
    uint64_t size = 2 * (T->pmask + 1), mask = size - 1;
    uint64_t *keys = PyMem_RawCalloc((size_t)size, sizeof(uint64_t));
    int32_t *idx = PyMem_RawMalloc((size_t)size * sizeof(int32_t));
    if (!keys || !idx) { PyMem_RawFree(keys); PyMem_RawFree(idx); return ERR_NOMEM; }
    for (uint64_t i = 0; i <= T->pmask; i++) {
        if (!T->pkeys[i]) continue;
        uint64_t j = mix64(T->pkeys[i]) & mask;
        while (keys[j]) j = (j + 1) & mask;
        keys[j] = T->pkeys[i]; idx[j] = T->pidx[i];
    }
    PyMem_RawFree(T->pkeys); PyMem_RawFree(T->pidx);
    T->pkeys = keys; T->pidx = idx; T->pmask = mask;
    return 0;
}

/* the pair (a, b), created (count 0) when new; -1 (ERR_NOMEM) on failure */
static int32_t pair_get(Trainer *T, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b), i = mix64(key) & T->pmask;
    for (; T->pkeys[i]; i = (i + 1) & T->pmask)
        if (T->pkeys[i] == key) return T->pidx[i];
    if (T->np == T->capp) {
        Py_ssize_t cap = T->capp ? 2 * T->capp : 4096;
        Pair *p = PyMem_RawRealloc(T->pairs, (size_t)cap * sizeof(Pair));
        if (!p) return ERR_NOMEM;
        T->pairs = p; T->capp = cap;
    }
    Pair *p = &T->pairs[T->np];
    p->a = a; p->b = b; p->count = 0; p->occ = NULL; p->nocc = p->capocc = 0; p->stamp = -1;
    T->pkeys[i] = key; T->pidx[i] = (int32_t)T->np;
    int32_t id = (int32_t)T->np++;
    if (2 * (uint64_t)T->np > T->pmask + 1 && pair_rehash(T) < 0) return ERR_NOMEM;
    return id;
}

static inline int32_t pair_find(const Trainer *T, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b), i = mix64(key) & T->pmask;
    for (; T->pkeys[i]; i = (i + 1) & T->pmask)
        if (T->pkeys[i] == key) return T->pidx[i];
    return -1;
}

static int occ_add(Pair *p, int32_t w) {
    if (p->nocc && p->occ[p->nocc - 1] == w) return 0;
    if (p->nocc == p->capocc) {
        int32_t cap = p->capocc ? 2 * p->capocc : 4;
        int32_t *occ = PyMem_RawRealloc(p->occ, (size_t)cap * sizeof(int32_t));
        if (!occ) return ERR_NOMEM;
        p->occ = occ; p->capocc = cap;
    }
    p->occ[p->nocc++] = w;
    return 0;
}

/* (bytes of x) vs (bytes of y), as Python compares bytes */
static inline int tok_cmp(const Trainer *T, int32_t x, int32_t y) {
    if (x == y) return 0;
    int32_t lx = T->tlen[x], ly = T->tlen[y];
    int c = memcmp(T->tb + T->toff[x], T->tb + T->toff[y], (size_t)(lx < ly ? lx : ly));
    return c ? c : (lx > ly) - (lx < ly);
}

/* whether heap item x ranks above y: greater count, then the greater (bytes_a, bytes_b) */
static inline int above(const Trainer *T, HeapItem x, HeapItem y) {
    if (x.count != y.count) return x.count > y.count;
    const Pair *p = &T->pairs[x.pair], *q = &T->pairs[y.pair];
    int c = tok_cmp(T, p->a, q->a);
    if (c == 0) c = tok_cmp(T, p->b, q->b);
    return c > 0;
}

static void sift_down(Trainer *T, Py_ssize_t i) {
    HeapItem x = T->heap[i];
    Py_ssize_t n = T->nh;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && above(T, T->heap[c + 1], T->heap[c])) c++;
        if (!above(T, T->heap[c], x)) break;
        T->heap[i] = T->heap[c]; i = c;
    }
    T->heap[i] = x;
}

static int heap_push_item(Trainer *T, HeapItem x) {
    if (T->nh == T->caph) {
        Py_ssize_t cap = T->caph ? 2 * T->caph : 4096;
        HeapItem *h = PyMem_RawRealloc(T->heap, (size_t)cap * sizeof(HeapItem));
        if (!h) return ERR_NOMEM;
        T->heap = h; T->caph = cap;
    }
    Py_ssize_t i = T->nh++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!above(T, x, T->heap[p])) break;
        T->heap[i] = T->heap[p]; i = p;
    }
    T->heap[i] = x;
    return 0;
}

static int tok_add(Trainer *T, int32_t id, int32_t a, int32_t b) {
    size_t la = (size_t)T->tlen[a], lb = (size_t)T->tlen[b];
    if (T->tbn + la + lb > T->tbcap) {
        size_t cap = 2 * T->tbcap;
        while (cap < T->tbn + la + lb) cap *= 2;
        unsigned char *tb = PyMem_RawRealloc(T->tb, cap);
        if (!tb) return ERR_NOMEM;
        T->tb = tb; T->tbcap = cap;
    }
    if (la + lb > 0x7fffffff) return ERR_BIG;
    memcpy(T->tb + T->tbn, T->tb + T->toff[a], la);
    memcpy(T->tb + T->tbn + la, T->tb + T->toff[b], lb);
    T->toff[id] = T->tbn; T->tlen[id] = (int32_t)(la + lb);
    T->tbn += la + lb;
    return 0;
}

static void trainer_free(Trainer *T) {
    for (Py_ssize_t k = 0; k < T->np; k++) PyMem_RawFree(T->pairs[k].occ);
    PyMem_RawFree(T->pairs); PyMem_RawFree(T->pkeys); PyMem_RawFree(T->pidx); PyMem_RawFree(T->heap);
    PyMem_RawFree(T->sym); PyMem_RawFree(T->woff); PyMem_RawFree(T->wlen); PyMem_RawFree(T->wfreq);
    PyMem_RawFree(T->wstamp); PyMem_RawFree(T->tb); PyMem_RawFree(T->toff); PyMem_RawFree(T->tlen);
    PyMem_RawFree(T->gained);
}

/* pair (x, y) gains f in word w: count it, index it, remember to push it */
static int gain(Trainer *T, int32_t x, int32_t y, int64_t f, int32_t w, int32_t step) {
    int32_t q = pair_get(T, x, y);
    if (q < 0) return ERR_NOMEM;
    Pair *p = &T->pairs[q];
    p->count += f;
    if (occ_add(p, w) < 0) return ERR_NOMEM;
    if (p->stamp != step) {
        p->stamp = step;
        if (T->ngained == T->capgained) {
            Py_ssize_t cap = T->capgained ? 2 * T->capgained : 256;
            int32_t *g = PyMem_RawRealloc(T->gained, (size_t)cap * sizeof(int32_t));
            if (!g) return ERR_NOMEM;
            T->gained = g; T->capgained = cap;
        }
        T->gained[T->ngained++] = q;
    }
    return 0;
}

static inline void lose(Trainer *T, int32_t x, int32_t y, int64_t f) {
    int32_t q = pair_find(T, x, y);
    if (q >= 0) T->pairs[q].count -= f;  /* always found: the pair was in the word */
}

/* Build the words from the pre-token table, run num_merges merges; out: merges[2k], [2k+1] */
static int run_merges(const CTable *words, Py_ssize_t num_merges, int32_t *out, Py_ssize_t *n_out, size_t *peak) {
    Trainer T;
    memset(&T, 0, sizeof(T));
    int rc = ERR_NOMEM;
    size_t nsym = 0;
    Py_ssize_t nw = 0;
    for (Py_ssize_t k = 0; k < words->n; k++) {  /* UTF-8 length of each multi-byte word */
        const CEntry *e = &words->ents[k];
        size_t m = 0;
        for (Py_ssize_t q = 0; q < e->len; q++) {
            uint32_t c = words->arena[e->off + q];
            m += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        }
        if (m >= 2) { nsym += m; nw++; }
    }
    if (nw >= 0x7fffffff) return ERR_BIG;
    T.sym = PyMem_RawMalloc((nsym ? nsym : 1) * sizeof(int32_t));
    T.woff = PyMem_RawMalloc((size_t)(nw ? nw : 1) * sizeof(size_t));
    T.wlen = PyMem_RawMalloc((size_t)(nw ? nw : 1) * sizeof(int32_t));
    T.wfreq = PyMem_RawMalloc((size_t)(nw ? nw : 1) * sizeof(int64_t));
    T.wstamp = PyMem_RawMalloc((size_t)(nw ? nw : 1) * sizeof(int32_t));
    Py_ssize_t ntok = 256 + num_merges;
    T.toff = PyMem_RawMalloc((size_t)ntok * sizeof(size_t));
    T.tlen = PyMem_RawMalloc((size_t)ntok * sizeof(int32_t));
    T.tbcap = 1 << 16;
    T.tb = PyMem_RawMalloc(T.tbcap);
    T.pmask = 4095;
    T.pkeys = PyMem_RawCalloc(4096, sizeof(uint64_t));
    T.pidx = PyMem_RawMalloc(4096 * sizeof(int32_t));
    if (!T.sym || !T.woff || !T.wlen || !T.wfreq || !T.wstamp || !T.toff || !T.tlen || !T.tb || !T.pkeys || !T.pidx)
        goto done;
    for (int b = 0; b < 256; b++) { T.tb[b] = (unsigned char)b; T.toff[b] = (size_t)b; T.tlen[b] = 1; }
    T.tbn = 256;
    size_t pos = 0;
    for (Py_ssize_t k = 0; k < words->n; k++) {
        const CEntry *e = &words->ents[k];
        const uint32_t *s = words->arena + e->off;
        if (e->len == 0 || (e->len == 1 && s[0] < 0x80)) continue;  /* one byte: no pairs */
        size_t start = pos;
        unsigned char u[4];
        for (Py_ssize_t q = 0; q < e->len; q++) {
            int w = utf8_put(s[q], u);
            if (w < 0) { rc = w; goto done; }
            for (int z = 0; z < w; z++) T.sym[pos++] = u[z];
        }
        if (pos - start > 0x7fffffff) { rc = ERR_BIG; goto done; }
        T.woff[T.nw] = start; T.wlen[T.nw] = (int32_t)(pos - start); T.wfreq[T.nw] = e->count;
        T.wstamp[T.nw] = -1; T.nw++;
    }
    for (Py_ssize_t w = 0; w < T.nw; w++) {  /* initial pair counts */
        const int32_t *s = T.sym + T.woff[w];
        for (int32_t i = 0; i + 1 < T.wlen[w]; i++) {
            int32_t q = pair_get(&T, s[i], s[i + 1]);
            if (q < 0) goto done;
            T.pairs[q].count += T.wfreq[w];
            if (occ_add(&T.pairs[q], (int32_t)w) < 0) goto done;
        }
    }
    for (Py_ssize_t q = 0; q < T.np; q++)
        if (heap_push_item(&T, (HeapItem){T.pairs[q].count, (int32_t)q}) < 0) goto done;
    Py_ssize_t m = 0;
    for (; m < num_merges; m++) {
        int32_t best = -1;
        while (T.nh) {
            HeapItem top = T.heap[0];
            int64_t now = T.pairs[top.pair].count;
            if (now == top.count && now > 0) { best = top.pair; break; }
            if (now > 0) { T.heap[0].count = now; sift_down(&T, 0); continue; }
            T.heap[0] = T.heap[--T.nh];
            if (T.nh) sift_down(&T, 0);
        }
        if (best < 0) break;
        T.heap[0] = T.heap[--T.nh];
        if (T.nh) sift_down(&T, 0);
        int32_t a = T.pairs[best].a, b = T.pairs[best].b, c = (int32_t)(256 + m), step = (int32_t)m;
        out[2 * m] = a; out[2 * m + 1] = b;
        if ((rc = tok_add(&T, c, a, b)) < 0) goto done;
        rc = ERR_NOMEM;
        int32_t *occ = T.pairs[best].occ, nocc = T.pairs[best].nocc;
        T.pairs[best].occ = NULL; T.pairs[best].nocc = T.pairs[best].capocc = 0;
        T.ngained = 0;
        for (int32_t o = 0; o < nocc; o++) {
            int32_t w = occ[o];
            if (T.wstamp[w] == step) continue;
            T.wstamp[w] = step;
            int32_t *s = T.sym + T.woff[w], n = T.wlen[w], wp = 0, r = 0;
            int64_t f = T.wfreq[w];
            while (r < n) {
                if (r + 1 < n && s[r] == a && s[r + 1] == b) {
                    if (wp > 0) {
                        int32_t x = s[wp - 1];
                        lose(&T, x, a, f);
                        if (gain(&T, x, c, f, w, step) < 0) { PyMem_RawFree(occ); goto done; }
                    }
                    if (r + 2 < n) {
                        int32_t y = s[r + 2];
                        lose(&T, b, y, f);
                        if (gain(&T, c, y, f, w, step) < 0) { PyMem_RawFree(occ); goto done; }
                    }
                    T.pairs[best].count -= f;
                    s[wp++] = c; r += 2;
                } else s[wp++] = s[r++];
            }
            T.wlen[w] = wp;
        }
        PyMem_RawFree(occ);
        for (Py_ssize_t g = 0; g < T.ngained; g++) {
            int32_t q = T.gained[g];
            if (T.pairs[q].count > 0 && heap_push_item(&T, (HeapItem){T.pairs[q].count, q}) < 0) goto done;
        }
    }
    *n_out = m;
    rc = 0;
    size_t bytes = nsym * sizeof(int32_t) + (size_t)T.nw * (sizeof(size_t) + 16) + (size_t)T.capp * sizeof(Pair)
                   + (T.pmask + 1) * 12 + (size_t)T.caph * sizeof(HeapItem) + T.tbcap;
    for (Py_ssize_t q = 0; q < T.np; q++) bytes += (size_t)T.pairs[q].capocc * sizeof(int32_t);
    *peak = bytes;
done:
    trainer_free(&T);
    return rc;
}

/* train(counter, pretokens, num_merges) -> (merges [(a, b)], distinct_pretokens, table_bytes) */
static PyObject *bpe_train(PyObject *self, PyObject *args) {
    PyObject *counter, *extra;
    Py_ssize_t num_merges;
    if (!PyArg_ParseTuple(args, "OOn", &counter, &extra, &num_merges)) return NULL;
    if (num_merges < 0 || num_merges > 0x7fffffff - 256) { PyErr_SetString(PyExc_ValueError, "bad num_merges"); return NULL; }
    ChunkCounter *cc = NULL;
    if (counter != Py_None) {
        if (!PyObject_TypeCheck(counter, &ChunkCounterType)) { PyErr_SetString(PyExc_TypeError, "counter must be a ChunkCounter or None"); return NULL; }
        cc = (ChunkCounter *)counter;
        if (counter_ready(cc) < 0) return NULL;
    }
    if (extra != Py_None && !PyDict_Check(extra)) { PyErr_SetString(PyExc_TypeError, "pretokens must be a dict or None"); return NULL; }
    CTable words;
    if (ct_init(&words) < 0) return PyErr_NoMemory();
    int rc = 0;
    if (extra != Py_None) {  /* {pretoken: count}, GIL held */
        PyObject *key, *val;
        Py_ssize_t pos = 0;
        while (rc == 0 && PyDict_Next(extra, &pos, &key, &val)) {
            long long n = PyLong_AsLongLong(val);
            if (!PyUnicode_Check(key) || (n == -1 && PyErr_Occurred())) {
                ct_free(&words);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "pretokens must map str to int");
                return NULL;
            }
            Py_UCS4 *u = PyUnicode_AsUCS4Copy(key);
            if (!u) { ct_free(&words); return NULL; }
            Py_ssize_t len = PyUnicode_GET_LENGTH(key);
            rc = ct_add4(&words, u, len, cp_hash(u, len), n);
            PyMem_Free(u);
        }
    }
    int32_t *out = PyMem_RawMalloc((size_t)(num_merges ? num_merges : 1) * 2 * sizeof(int32_t));
    if (!out) { ct_free(&words); return PyErr_NoMemory(); }
    Py_ssize_t n_out = 0;
    size_t peak = 0, table_bytes = cc ? ct_bytes(&cc->t) : 0;
    if (cc) cc->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    if (cc) {  /* pre-tokenize each distinct chunk once */
        Matcher match = MATCHERS[cc->mode];
        for (Py_ssize_t k = 0; k < cc->t.n && rc == 0; k++) {
            const CEntry *e = &cc->t.ents[k];
            const uint32_t *s = cc->t.arena + e->off;
            for (Py_ssize_t i = 0; i < e->len && rc == 0;) {
                Py_ssize_t len = match((const Py_UCS4 *)s, i, e->len);
                rc = ct_add4(&words, (const Py_UCS4 *)s + i, len, cp_hash(s + i, len), e->count);
                i += len;
            }
        }
    }
    table_bytes += ct_bytes(&words);
    if (rc == 0) rc = run_merges(&words, num_merges, out, &n_out, &peak);
    Py_END_ALLOW_THREADS
    if (cc) cc->busy = 0;
    Py_ssize_t distinct = words.n;
    ct_free(&words);
    if (rc < 0) { PyMem_RawFree(out); return raise_err(rc), NULL; }
    PyObject *list = PyList_New(n_out);
    for (Py_ssize_t m = 0; list && m < n_out; m++) {
        PyObject *t = Py_BuildValue("(ii)", out[2 * m], out[2 * m + 1]);
        if (!t) { Py_CLEAR(list); break; }
        PyList_SET_ITEM(list, m, t);
    }
    PyMem_RawFree(out);
    if (!list) return NULL;
    return Py_BuildValue("(Nnn)", list, distinct, (Py_ssize_t)(table_bytes + peak));
}

#undef TRAIN_METHODS
#define TRAIN_METHODS \
    {"train", bpe_train, METH_VARARGS, "train(counter, pretokens, num_merges) -> (merges, distinct_pretokens, table_bytes)"},
