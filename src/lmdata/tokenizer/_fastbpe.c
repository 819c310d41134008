/* _fastbpe: the compiled encoding and training loops of lmdata.tokenizer (plain CPython C API).
 *
 * Encoder(merges, byte_ids, pretokenize, cache_entries, max_cached_chunk, mode, n_ids) holds
 *   - the merge table: an open-addressing hash (left_id, right_id) -> (rank, merged id); a
 *     merge is (left, right, merged) with its index as rank, or (left, right, merged, rank)
 *     (tiktoken's BPE over ranks: every split of a token has the token's rank);
 *   - whole words (set_words): pre-tokens that are a token BPE cannot reach, given as that
 *     token (tiktoken looks a whole piece up first; such files have tokens no pair makes);
 *   - the byte -> id table (identity for our vocabs, a permutation for GPT-2's);
 *   - one chunk cache: chunk code points -> ids, in C (no str object per chunk), shared by
 *     every concurrent call (lock-free reads and inserts; see take_cache), so threads
 *     of encode_batch never encode the same chunk twice;
 *   - the special tokens (set_specials), split off in C by encode and encode_many;
 *   - mode: the pre-tokenizer. 0 = GPT-2, 1 = cl100k, 2 = o200k: done here, in C, with the
 *     character classes of the `regex` module (set_classes), and with the GIL released;
 *     3 = a custom regex compiled to a Program (program=; _fastbpe_regex.c), GIL released,
 *     its pre-tokens the cache's chunks (no cut points are known for it);
 *     -1 = any other regex: pretokenize(text) (its findall) is called, GIL held.
 * encode(text) cuts text into chunks exactly as patterns.Pattern.split_pieces does (before a
 * " " followed by a character that is not str.isspace(); for cl100k also after one), looks
 * each chunk up in the cache (a batch of 16 slots prefetched at a time), and on a miss
 * pre-tokenizes it and runs BPE on each pre-token.  encode_many(texts) does a list in one GIL
 * release, encode_flat(texts, ...) the same into one uint16/uint32 buffer (no int objects);
 * encode_plain(text) leaves special-token strings as text.  bpe(bytes) is one
 * pre-token.  BPE: pre-tokens of up to 32 bytes in arrays (bpe_tiny), longer ones over a
 * linked list plus a binary min-heap of (rank, position); either way all pairs of the lowest
 * rank are merged left to right as one step (= str.replace of the best pair), and a 1 MB
 * pre-token costs O(n log n).  The Python encoder is the reference this must equal.
 * The trainer (ChunkCounter, train) is in _fastbpe_train.c, #included at the end.
 *
 * Everything that runs without the GIL allocates with PyMem_Raw* and reports failure by a
 * return code (ERR_NOMEM, ERR_BIG, ERR_SURROGATE), turned into an exception afterwards.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

#define ERR_NOMEM -1
#define ERR_BIG -2
#define ERR_SURROGATE -3
#define ERR_NOMATCH -4    /* a custom pattern (Program) matches nothing at some character */
#define ERR_BACKTRACK -5  /* a custom pattern's match ran past its step budget */

/* where a Program last matched nothing, in this thread: the character and its offset in the segment */
static _Thread_local Py_UCS4 nomatch_char;
static _Thread_local Py_ssize_t nomatch_at;

static int raise_lmdata_error(PyObject *msg) {
    PyObject *mod = PyImport_ImportModule("lmdata.errors"), *cls = mod ? PyObject_GetAttrString(mod, "LmdataError") : NULL;
    if (msg) PyErr_SetObject(cls ? cls : PyExc_ValueError, msg);
    Py_XDECREF(cls); Py_XDECREF(mod); Py_XDECREF(msg);
    return -1;
}

static int raise_err(int rc) {
    if (rc == ERR_NOMATCH) {
        PyObject *c = PyUnicode_FromOrdinal((int)nomatch_char);
        PyObject *msg = c ? PyUnicode_FromFormat("the pre-tokenizer pattern does not match the character %R at offset "
                                                 "%zd; its pieces would drop text", c, nomatch_at) : NULL;
        Py_XDECREF(c);
        return raise_lmdata_error(msg);
    }
    if (rc == ERR_BACKTRACK) return raise_lmdata_error(PyUnicode_FromString(
        "the pre-tokenizer pattern backtracked past its step budget on this text (catastrophic backtracking); "
        "simplify the pattern"));
    if (rc == ERR_NOMEM) PyErr_NoMemory();
    else if (rc == ERR_BIG) PyErr_SetString(PyExc_ValueError, "a single pre-token of 2 GiB or more cannot be encoded");
    else if (rc == ERR_SURROGATE) PyErr_SetString(PyExc_ValueError,
                                                  "text holds a lone surrogate, which has no UTF-8 form");
    return -1;
}

typedef struct { uint64_t key; int32_t rank; int32_t merged; } MergeSlot;  /* key 0 = empty */
typedef struct { uint64_t hash; int32_t id, len; unsigned char *bytes; } WordSlot;  /* hash 0 = empty */

typedef struct Entry {
    uint64_t hash;
    int32_t nchars, nids;
    int32_t data[];  /* nchars code points, then nids ids */
} Entry;

/* A cache slot is one 64-byte line: a chunk of up to 12 BMP code points with up to 8 ids
 * lives in it (most chunks of prose), so a hit costs one cache miss; a longer one is an Entry
 * on the heap (nchars == BIG). */
#define IN_CHARS 12
#define IN_IDS 8
#define BIG 0xFF
#define BUSY 2u  /* the tag of a slot being written */
typedef struct {
    uint32_t tag;  /* high half of the hash, | 1; 0 = empty */
    uint8_t nchars, nids;
    uint16_t chars[IN_CHARS];
    union { int32_t ids[IN_IDS]; Entry *entry; } u;
} Slot;

typedef struct Cache {
    Slot *slots;
    uint64_t mask;
    Py_ssize_t used, limit;  /* used: inserts so far, but for each thread's last < flush_every */
    Py_ssize_t flush_every;  /* 64, or 1 for a small cache: the table must never fill up */
    int mapped, touched;  /* slots from mmap (zero pages); every page of them faulted in */
    size_t touch_next;  /* the next byte of the table to fault in (touch_cache) */
    struct Cache *next;
} Cache;

/* a compiled custom pattern (_fastbpe_regex.c) */
#define MAX_STEPS 8  /* regexes of a chain */
typedef struct Prog { int32_t *code; Py_ssize_t ncode, ninstr; int32_t entry[MAX_STEPS]; int nsteps; uint32_t *table; } Prog;

typedef struct {
    PyObject_HEAD
    MergeSlot *merges;
    uint64_t merge_mask;
    int one_at_a_time;  /* ranked (4-tuple merges): merge one pair, the leftmost of the lowest rank, then
                           look again (tiktoken's loop), not every pair of that rank at once */
    WordSlot *words;  /* set_words; NULL: none */
    uint64_t word_mask;
    Py_ssize_t word_max;  /* the longest word's length */
    int32_t byte_ids[256];
    PyObject *pretokenize;
    PyObject **id_objs;  /* id -> int object, so the output list shares them */
    Py_ssize_t n_ids;
    Cache *cache;  /* one chunk cache, shared by every concurrent call (see encode_cached) */
    PyThread_type_lock lock;  /* taken to clear the cache and to join it */
    int active;  /* calls using the cache now (atomic) */
    /* special tokens (set_specials), longest first: split off in C by encode and encode_many */
    Py_ssize_t nspec;
    Py_UCS4 **spec; Py_ssize_t *spec_len; int32_t *spec_id;
    uint8_t first[256]; int first_wide; Py_UCS4 only_first;  /* first characters; the one, if one */
    Py_ssize_t cache_limit, max_cached_chunk;
    int mode;  /* 0 gpt2, 1 cl100k, 2 o200k, 3 a Program (prog), -1 the pretokenize callback */
    PyObject *program; const Prog *prog;
} Encoder;

/* ---------------------------------------------------------------- growable id buffer */

typedef struct { int32_t *v; Py_ssize_t n, cap; } IdBuf;

static int buf_reserve(IdBuf *b, Py_ssize_t extra) {
    if (b->n + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->n + extra) cap *= 2;
    int32_t *v = PyMem_RawRealloc(b->v, (size_t)cap * sizeof(int32_t));
    if (!v) return ERR_NOMEM;
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

static uint64_t bytes_hash(const unsigned char *s, Py_ssize_t n) {
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return mix64(h) | 1;
}

/* The id of the whole word s[0:n] (set_words), or -1. */
static int32_t word_find(const Encoder *e, const unsigned char *s, Py_ssize_t n) {
    if (!e->words || n > e->word_max) return -1;
    uint64_t h = bytes_hash(s, n), i = h & e->word_mask;
    for (;;) {
        const WordSlot *w = &e->words[i];
        if (w->hash == 0) return -1;
        if (w->hash == h && w->len == n && memcmp(w->bytes, s, (size_t)n) == 0) return w->id;
        i = (i + 1) & e->word_mask;
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

/* BPE of a short pre-token (2 < n <= TINY) in arrays: each step finds the lowest rank by a
 * scan and merges all its pairs left to right (= str.replace), then looks up only the pairs
 * next to a merge; pairs between two untouched symbols keep their rank.  Fewer lookups and
 * branches than the heap for the words prose is made of (callgrind: ~1,000 instructions per
 * pre-token with the heap). */
#define TINY 32
static int bpe_tiny(const Encoder *e, const unsigned char *s, int n, IdBuf *out) {
    int32_t sym[TINY], mg[TINY];
    uint32_t rk[TINY];
    uint8_t fresh[TINY];
    for (int i = 0; i < n; i++) sym[i] = e->byte_ids[s[i]];
    for (int i = 0; i + 1 < n; i++) {
        const MergeSlot *m = merge_find(e, sym[i], sym[i + 1]);
        rk[i] = m ? (uint32_t)m->rank : UINT32_MAX;
        mg[i] = m ? m->merged : 0;
    }
    while (n > 1) {
        uint32_t best = UINT32_MAX;
        for (int i = 0; i + 1 < n; i++) best = rk[i] < best ? rk[i] : best;
        if (best == UINT32_MAX) break;
        int w = 0, more = 1;
        for (int i = 0; i < n; w++) {
            if (more && i + 1 < n && rk[i] == best) { sym[w] = mg[i]; fresh[w] = 1; i += 2; more = !e->one_at_a_time; }
            else { sym[w] = sym[i]; rk[w] = rk[i]; mg[w] = mg[i]; fresh[w] = 0; i++; }
        }
        n = w;
        for (int k = 0; k + 1 < n; k++) {
            if (!fresh[k] && !fresh[k + 1]) continue;  /* the same two symbols as before: same rank */
            const MergeSlot *m = merge_find(e, sym[k], sym[k + 1]);
            rk[k] = m ? (uint32_t)m->rank : UINT32_MAX;
            mg[k] = m ? m->merged : 0;
        }
    }
    if (buf_reserve(out, n) < 0) return ERR_NOMEM;
    memcpy(out->v + out->n, sym, (size_t)n * sizeof(int32_t));
    out->n += n;
    return 0;
}

/* Append the BPE ids of the UTF-8 bytes s[0:n] to out (no GIL needed). */
static int bpe_bytes(const Encoder *e, const unsigned char *s, Py_ssize_t n, IdBuf *out) {
    if (n == 0) return 0;
    if (n >= 0x7fffffff) return ERR_BIG;  /* positions are 32-bit in the heap entries */
    if (n == 1) {
        if (buf_reserve(out, 1) < 0) return ERR_NOMEM;
        out->v[out->n++] = e->byte_ids[s[0]];
        return 0;
    }
    if (n == 2 && !e->words) {  /* the common short case: one lookup */
        const MergeSlot *m = merge_find(e, e->byte_ids[s[0]], e->byte_ids[s[1]]);
        if (buf_reserve(out, 2) < 0) return ERR_NOMEM;
        if (m) out->v[out->n++] = m->merged;
        else { out->v[out->n++] = e->byte_ids[s[0]]; out->v[out->n++] = e->byte_ids[s[1]]; }
        return 0;
    }
    int32_t whole = word_find(e, s, n);
    if (whole >= 0) {
        if (buf_reserve(out, 1) < 0) return ERR_NOMEM;
        out->v[out->n++] = whole;
        return 0;
    }
    if (n <= TINY) return bpe_tiny(e, s, (int)n, out);
    /* one block: sym, nxt, prv (int32 each), heap (uint64, at most n - 1 + 2 per merge) */
    enum { SMALL = 64 };
    int32_t small_sym[SMALL], small_nxt[SMALL], small_prv[SMALL];
    uint64_t small_heap[3 * SMALL], small_pending[2 * SMALL];
    int32_t *sym = small_sym, *nxt = small_nxt, *prv = small_prv;
    uint64_t *heapv = small_heap, *pending = small_pending;
    void *block = NULL;
    if (n > SMALL) {
        /* heap holds at most (n - 1) + 2 * merges <= 3n entries; pending at most 2n */
        block = PyMem_RawMalloc((size_t)n * (3 * sizeof(int32_t) + 5 * sizeof(uint64_t)));
        if (!block) return ERR_NOMEM;
        heapv = (uint64_t *)block;
        pending = heapv + 3 * n;
        sym = (int32_t *)(pending + 2 * n);
        nxt = sym + n; prv = nxt + n;
    }
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
            if (e->one_at_a_time) break;
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
    PyMem_RawFree(block);
    return rc;
}

/* ---------------------------------------------------------------- pre-tokenizing */

/* One byte per code point, from the `regex` module (unicode_classes.py). */
#define F_S 1   /* \s */
#define F_L 2   /* \p{L} */
#define F_N 4   /* \p{N} */
#define F_U 8   /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] */
#define F_W 16  /* [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
static uint8_t *uclass = NULL;

static inline uint8_t cls(Py_UCS4 c) { return c < 0x110000 ? uclass[c] : 0; }
static inline int is_o(Py_UCS4 c) { return !(cls(c) & (F_S | F_L | F_N)); } /* [^\s\p{L}\p{N}] */
static inline int is_nl(Py_UCS4 c) { return c == '\r' || c == '\n'; }
/* (?i:x) for an ASCII lowercase letter x; U+017F LONG S folds to s */
static inline int ci(Py_UCS4 c, char x) { return c == (Py_UCS4)x || c == (Py_UCS4)(x - 32) || (x == 's' && c == 0x17F); }

/* the class among \s, \p{L}, \p{N}, other */
static inline int kind(Py_UCS4 c) {
    uint8_t k = cls(c);
    return (k & F_S) ? F_S : (k & F_L) ? F_L : (k & F_N) ? F_N : 0;
}

/* '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static Py_ssize_t match_gpt2(const Py_UCS4 *s, Py_ssize_t i, Py_ssize_t n) {
    Py_UCS4 c = s[i];
    if (c == '\'' && i + 1 < n) {
        Py_UCS4 d = s[i + 1];
        if (d == 's' || d == 'd' || d == 'm' || d == 't') return 2;
        if (i + 2 < n) {
            Py_UCS4 f = s[i + 2];
            if ((d == 'l' && f == 'l') || (d == 'v' && f == 'e') || (d == 'r' && f == 'e')) return 3;
        }
    }
    Py_ssize_t j = i;
    if (c == ' ' && i + 1 < n && kind(s[i + 1]) != F_S) j = i + 1;
    int k = kind(s[j]);
    if (k != F_S) {
        j++;
        while (j < n && kind(s[j]) == k) j++;
        return j - i;
    }
    j = i;
    while (j < n && (cls(s[j]) & F_S)) j++;
    if (j == n || j - i == 1) return j - i;  /* \s+ to the end, or a single \s */
    return j - i - 1;                        /* leave the last space to the next match's ' ?' */
}

/* '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s */
static Py_ssize_t match_cl100k(const Py_UCS4 *s, Py_ssize_t i, Py_ssize_t n) {
    Py_UCS4 c = s[i];
    if (c == '\'' && i + 1 < n) {
        Py_UCS4 d = s[i + 1];
        if (ci(d, 's') || ci(d, 'd') || ci(d, 'm') || ci(d, 't')) return 2;
        if (i + 2 < n) {
            Py_UCS4 f = s[i + 2];
            if ((ci(d, 'l') && ci(f, 'l')) || (ci(d, 'v') && ci(f, 'e')) || (ci(d, 'r') && ci(f, 'e'))) return 3;
        }
    }
    uint8_t k = cls(c);
    Py_ssize_t j = (!(k & (F_L | F_N)) && !is_nl(c)) ? i + 1 : i;  /* the possessive prefix */
    if (j < n && (cls(s[j]) & F_L)) {
        j++;
        while (j < n && (cls(s[j]) & F_L)) j++;
        return j - i;
    }
    if (k & F_N) {
        j = i + 1;
        while (j < n && j - i < 3 && (cls(s[j]) & F_N)) j++;
        return j - i;
    }
    j = (c == ' ' && i + 1 < n && is_o(s[i + 1])) ? i + 1 : i;
    if (is_o(s[j])) {
        j++;
        while (j < n && is_o(s[j])) j++;
        while (j < n && is_nl(s[j])) j++;
        return j - i;
    }
    j = i;
    while (j < n && (cls(s[j]) & F_S)) j++;
    if (j == n) return j - i;                                     /* \s++$ */
    for (Py_ssize_t q = j - 1; q >= i; q--) if (is_nl(s[q])) return q + 1 - i;  /* \s*[\r\n] */
    return j - i >= 2 ? j - i - 1 : 1;                            /* \s+(?!\S) | \s */
}

static inline Py_ssize_t o200k_suffix(const Py_UCS4 *s, Py_ssize_t e, Py_ssize_t n) {  /* (?i:'s|'t|'re|'ve|'m|'ll|'d)? */
    if (e + 1 < n && s[e] == '\'') {
        Py_UCS4 d = s[e + 1];
        if (ci(d, 's') || ci(d, 't') || ci(d, 'm') || ci(d, 'd')) return e + 2;
        if (e + 2 < n) {
            Py_UCS4 f = s[e + 2];
            if ((ci(d, 'r') && ci(f, 'e')) || (ci(d, 'v') && ci(f, 'e')) || (ci(d, 'l') && ci(f, 'l'))) return e + 3;
        }
    }
    return e;
}

/* [^\r\n\p{L}\p{N}]?[U]*[W]+('s..)? | [^\r\n\p{L}\p{N}]?[U]+[W]*('s..)? | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n/]*
 * | \s*[\r\n]+ | \s+(?!\S) | \s+     (U, W: the o200k letter sets above) */
static Py_ssize_t match_o200k(const Py_UCS4 *s, Py_ssize_t i, Py_ssize_t n) {
    Py_UCS4 c = s[i];
    uint8_t k = cls(c);
    int pre = !(k & (F_L | F_N)) && !is_nl(c);
    for (int take = pre; take >= 0; take--) {  /* first alternative, prefix taken first */
        Py_ssize_t p = i + take, u = p;
        while (u < n && (cls(s[u]) & F_U)) u++;
        for (Py_ssize_t q = u; q >= p; q--) {  /* [U]* gives back until [W]+ can start */
            if (q < n && (cls(s[q]) & F_W)) {
                Py_ssize_t e = q + 1;
                while (e < n && (cls(s[e]) & F_W)) e++;
                return o200k_suffix(s, e, n) - i;
            }
        }
    }
    for (int take = pre; take >= 0; take--) {
        Py_ssize_t p = i + take;
        if (p < n && (cls(s[p]) & F_U)) {
            Py_ssize_t e = p + 1;
            while (e < n && (cls(s[e]) & F_U)) e++;
            while (e < n && (cls(s[e]) & F_W)) e++;
            return o200k_suffix(s, e, n) - i;
        }
    }
    if (k & F_N) {
        Py_ssize_t j = i + 1;
        while (j < n && j - i < 3 && (cls(s[j]) & F_N)) j++;
        return j - i;
    }
    Py_ssize_t j = (c == ' ' && i + 1 < n && is_o(s[i + 1])) ? i + 1 : i;
    if (is_o(s[j])) {
        j++;
        while (j < n && is_o(s[j])) j++;
        while (j < n && (is_nl(s[j]) || s[j] == '/')) j++;
        return j - i;
    }
    j = i;
    while (j < n && (cls(s[j]) & F_S)) j++;
    for (Py_ssize_t q = j - 1; q >= i; q--) if (is_nl(s[q])) return q + 1 - i;  /* \s*[\r\n]+ */
    if (j == n || j - i == 1) return j - i;                                     /* \s+(?!\S) | \s+ */
    return j - i - 1;
}

/* mode 3 (a Program): a chunk is one pre-token already */
static Py_ssize_t match_whole(const Py_UCS4 *s, Py_ssize_t i, Py_ssize_t n) { return n - i; }

typedef Py_ssize_t (*Matcher)(const Py_UCS4 *, Py_ssize_t, Py_ssize_t);
static const Matcher MATCHERS[4] = {match_gpt2, match_cl100k, match_o200k, match_whole};

static inline int utf8_put(Py_UCS4 c, unsigned char *o) {
    if (c < 0x80) { o[0] = (unsigned char)c; return 1; }
    if (c < 0x800) { o[0] = 0xC0 | (c >> 6); o[1] = 0x80 | (c & 0x3F); return 2; }
    if (c < 0x10000) {
        if (c >= 0xD800 && c <= 0xDFFF) return ERR_SURROGATE;
        o[0] = 0xE0 | (c >> 12); o[1] = 0x80 | ((c >> 6) & 0x3F); o[2] = 0x80 | (c & 0x3F); return 3;
    }
    o[0] = 0xF0 | (c >> 18); o[1] = 0x80 | ((c >> 12) & 0x3F); o[2] = 0x80 | ((c >> 6) & 0x3F); o[3] = 0x80 | (c & 0x3F);
    return 4;
}

/* Append the ids of one chunk (code points c[0:n]) to out: pre-tokenize in C, BPE each. */
static int encode_chunk(const Encoder *e, const Py_UCS4 *c, Py_ssize_t n, IdBuf *out) {
    Matcher match = MATCHERS[e->mode];
    unsigned char small[1024], *buf = small;
    Py_ssize_t cap = sizeof(small);
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0;) {
        Py_ssize_t len = match(c, i, n), m = 0;
        if (4 * len > cap) {
            while (4 * len > cap) cap *= 2;
            unsigned char *bigger = PyMem_RawRealloc(buf == small ? NULL : buf, (size_t)cap);
            if (!bigger) { rc = ERR_NOMEM; break; }
            buf = bigger;
        }
        for (Py_ssize_t q = i; q < i + len; q++) {
            int w = utf8_put(c[q], buf + m);
            if (w < 0) { rc = w; break; }
            m += w;
        }
        if (rc == 0) rc = bpe_bytes(e, buf, m, out);
        i += len;
    }
    if (buf != small) PyMem_RawFree(buf);
    return rc;
}

/* ---------------------------------------------------------------- chunk caches */


/* The slot table is mapped, not malloc'ed: it is faulted in whole (touch_cache) before a big
 * call, as huge pages where the kernel allows.  Left to fault lazily, two threads writing new
 * chunks into it at random spent 0.2 s of system time per 23 MB in the page-fault path, and
 * ran no faster than one (2 threads: 0.46 s cold vs 0.26 s prefaulted; one thread: 0.44 s). */
static Slot *table_new(size_t bytes, int *mapped) {
#if defined(MAP_ANONYMOUS)
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
#if defined(MADV_HUGEPAGE)
        madvise(p, bytes, MADV_HUGEPAGE);
#endif
        *mapped = 1;
        return p;
    }
#endif
    *mapped = 0;
    return PyMem_RawCalloc(bytes, 1);
}

static size_t table_bytes(const Cache *c) { return (size_t)(c->mask + 1) * sizeof(Slot); }

static Cache *cache_new(Py_ssize_t limit) {
    Cache *c = PyMem_RawCalloc(1, sizeof(Cache));
    if (!c) return NULL;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)limit) size *= 2;
    c->mask = size - 1;
    c->slots = table_new(table_bytes(c), &c->mapped);
    if (!c->slots) { PyMem_RawFree(c); return NULL; }
    c->limit = limit;
    c->flush_every = limit >= (1 << 16) ? 64 : 1;  /* 1,000 threads overshoot a big limit by < 64 K */
    return c;
}

/* Fault the table in, 2 MB at a time, shared by every thread that arrives before it is done.
 * Each page is touched by an atomic OR of 0 into its first slot's tag, which changes nothing:
 * safe beside inserts into the same slots (by an earlier small call, or another thread). */
static void touch_cache(Cache *c) {
    const size_t page = 4096, region = (size_t)1 << 21, bytes = table_bytes(c);
    for (;;) {
        size_t start = __atomic_fetch_add(&c->touch_next, region, __ATOMIC_RELAXED);
        if (start >= bytes) break;
        for (size_t at = start; at < start + region && at < bytes; at += page)
            __atomic_fetch_or((uint32_t *)(void *)((char *)c->slots + at), 0u, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&c->touched, 1, __ATOMIC_RELEASE);
}

static void cache_clear(Cache *c) {  /* with no reader active */
    if (c->used == 0) return;
    for (uint64_t i = 0; i <= c->mask; i++) {
        Slot *s = &c->slots[i];
        if (s->tag && s->nchars == BIG) PyMem_RawFree(s->u.entry);
        __atomic_store_n(&s->tag, 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&c->used, 0, __ATOMIC_RELAXED);
}

static void cache_free(Cache *c) {
    cache_clear(c);
#if defined(MAP_ANONYMOUS)
    if (c->mapped) munmap(c->slots, table_bytes(c));
    else
#endif
    PyMem_RawFree(c->slots);
    PyMem_RawFree(c);
}

/* The cache is shared by concurrent calls (threads of encode_batch), so a chunk is encoded
 * once whichever thread meets it first.  Nothing takes a lock to read or insert: an insert
 * claims an empty slot by swapping its tag 0 -> BUSY, writes it, then stores the real tag
 * with release order, and the slot never changes again until a clear; readers load tags with
 * acquire order and pass over BUSY (even; real tags are odd) like any other key.  Two threads
 * may keep the same chunk twice: harmless.  Clearing a full cache happens under the join lock
 * and only while the clearing call is the only one active (joining takes the lock too), else
 * the new chunk is simply not kept.  The table has 2x `limit` slots, so probes always end. */
#define TOUCH_CHARS (1 << 16)  /* a call this big faults the whole table in first */
static Cache *take_cache(Encoder *e, Py_ssize_t chars) {  /* with the GIL held */
    if (!PyThread_acquire_lock(e->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS  /* a clear is under way in another thread */
        PyThread_acquire_lock(e->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    __atomic_add_fetch(&e->active, 1, __ATOMIC_ACQ_REL);
    PyThread_release_lock(e->lock);
    if (chars >= TOUCH_CHARS && !__atomic_load_n(&e->cache->touched, __ATOMIC_ACQUIRE)) {
        Py_BEGIN_ALLOW_THREADS
        touch_cache(e->cache);
        Py_END_ALLOW_THREADS
    }
    return e->cache;
}

/* Inserts are counted per thread and added to the shared count 64 at a time (and when a call
 * ends): a shared counter and lock taken per insert cost two threads ~10% more CPU than one. */
static _Thread_local Py_ssize_t unflushed;

static void flush_inserts(Cache *c) {
    if (unflushed) __atomic_add_fetch(&c->used, unflushed, __ATOMIC_RELAXED);
    unflushed = 0;
}

static void give_cache(Encoder *e, Cache *c) {
    flush_inserts(c);
    __atomic_sub_fetch(&e->active, 1, __ATOMIC_ACQ_REL);
}

static inline uint32_t tag_of(const Slot *x) { return __atomic_load_n(&x->tag, __ATOMIC_ACQUIRE); }

static inline int slot_equal(const Slot *x, uint64_t hash, const Py_UCS4 *c, Py_ssize_t n) {
    if (x->nchars == BIG) {
        const Entry *e = x->u.entry;
        if (e->hash != hash || e->nchars != n) return 0;
        return memcmp(e->data, c, (size_t)n * sizeof(int32_t)) == 0;
    }
    if (x->nchars != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++) if (x->chars[i] != c[i]) return 0;
    return 1;
}

/* Encode the chunk c[0:n] through the cache. */
static int encode_cached(const Encoder *e, Cache *cache, const Py_UCS4 *c, Py_ssize_t n, uint64_t hash, IdBuf *out) {
    if (n > e->max_cached_chunk) return encode_chunk(e, c, n, out);
    uint32_t tag = (uint32_t)(hash >> 32) | 1;
    uint64_t i = hash & cache->mask;
    uint32_t seen;  /* the tag as loaded (acquire): the slot's contents are read after it */
    for (Slot *x; (seen = tag_of(x = &cache->slots[i])) != 0; i = (i + 1) & cache->mask) {
        if (seen == tag && slot_equal(x, hash, c, n)) {
            Py_ssize_t k = x->nchars == BIG ? x->u.entry->nids : x->nids;
            const int32_t *ids = x->nchars == BIG ? x->u.entry->data + n : x->u.ids;
            if (buf_reserve(out, k) < 0) return ERR_NOMEM;
            memcpy(out->v + out->n, ids, (size_t)k * sizeof(int32_t));
            out->n += k;
            return 0;
        }
    }
    Py_ssize_t before = out->n;
    int rc = encode_chunk(e, c, n, out);
    if (rc < 0) return rc;
    Py_ssize_t nids = out->n - before;
    int inline_ok = n <= IN_CHARS && nids <= IN_IDS;
    for (Py_ssize_t k = 0; inline_ok && k < n; k++) if (c[k] > 0xFFFF) inline_ok = 0;
    Entry *en = NULL;
    if (!inline_ok) {
        en = PyMem_RawMalloc(sizeof(Entry) + (size_t)(n + nids) * sizeof(int32_t));
        if (!en) return ERR_NOMEM;
        en->hash = hash; en->nchars = (int32_t)n; en->nids = (int32_t)nids;
        memcpy(en->data, c, (size_t)n * sizeof(int32_t));
        memcpy(en->data + n, out->v + before, (size_t)nids * sizeof(int32_t));
    }
    if (__atomic_load_n(&cache->used, __ATOMIC_RELAXED) + unflushed >= cache->limit) {
        /* full: cleared only by the one call using it, holding the join lock so none joins */
        if (__atomic_load_n(&e->active, __ATOMIC_ACQUIRE) != 1 || !PyThread_acquire_lock(e->lock, NOWAIT_LOCK)) {
            PyMem_RawFree(en);
            return 0;
        }
        int alone = __atomic_load_n(&e->active, __ATOMIC_ACQUIRE) == 1;
        if (alone) { flush_inserts(cache); cache_clear(cache); }
        PyThread_release_lock(e->lock);
        if (!alone) { PyMem_RawFree(en); return 0; }
    }
    Slot *x;
    for (i = hash & cache->mask;; i = (i + 1) & cache->mask) {
        x = &cache->slots[i];
        uint32_t t = tag_of(x), empty = 0;
        if (t == tag && slot_equal(x, hash, c, n)) { PyMem_RawFree(en); return 0; }  /* another thread's */
        if (t == 0 && __atomic_compare_exchange_n(&x->tag, &empty, BUSY, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;  /* claimed; a slot another thread claimed first is passed over like a full one */
    }
    if (inline_ok) {
        for (Py_ssize_t k = 0; k < n; k++) x->chars[k] = (uint16_t)c[k];
        memcpy(x->u.ids, out->v + before, (size_t)nids * sizeof(int32_t));
        x->nchars = (uint8_t)n; x->nids = (uint8_t)nids;
    } else {
        x->u.entry = en;
        x->nchars = BIG;
    }
    __atomic_store_n(&x->tag, tag, __ATOMIC_RELEASE);
    if (++unflushed >= cache->flush_every) flush_inserts(cache);
    return 0;
}

/* ---------------------------------------------------------------- encoding a text */

/* Chunks are cut a batch at a time and the cache slot of each is prefetched before any is
 * looked up, so the slot misses of a batch overlap (perf: 81% of encode_cached was the load
 * of the slot's tag, a DRAM miss for rarer chunks). */
#define BATCH 16
#define CHUNK_LOOP(TYPE)                                                                         \
    do {                                                                                         \
        const TYPE *d = (const TYPE *)data;                                                      \
        Py_ssize_t start = 0;                                                                    \
        Py_ssize_t qs[BATCH + 1];                                                                \
        uint64_t qh[BATCH];                                                                      \
        while (start < len && rc == 0) {                                                         \
            int nq = 0;                                                                          \
            qs[0] = start;                                                                       \
            while (nq < BATCH && start < len) {                                                  \
                Py_ssize_t i = start;                                                            \
                uint64_t hash = 0xcbf29ce484222325ULL;                                           \
                for (;;) {                                                                       \
                    hash = (hash ^ d[i]) * 0x100000001b3ULL;                                     \
                    i++;                                                                         \
                    if (i >= len) break;                                                         \
                    if (d[i] == ' ' && i + 1 < len && !Py_UNICODE_ISSPACE(d[i + 1])              \
                        && (!strict || !Py_UNICODE_ISSPACE(d[i - 1]))) break;                    \
                }                                                                                \
                qh[nq] = mix64(hash);                                                            \
                __builtin_prefetch(&cache->slots[qh[nq] & cache->mask]);                         \
                qs[++nq] = start = i;                                                            \
            }                                                                                    \
            for (int k = 0; k < nq && rc == 0; k++) {                                            \
                Py_ssize_t m = qs[k + 1] - qs[k];                                                \
                if (m > cap) {                                                                   \
                    while (m > cap) cap *= 2;                                                    \
                    Py_UCS4 *bigger = PyMem_RawMalloc((size_t)cap * sizeof(Py_UCS4));           \
                    if (!bigger) { rc = ERR_NOMEM; break; }                                      \
                    if (cp != small) PyMem_RawFree(cp);                                          \
                    cp = bigger;                                                                 \
                }                                                                                \
                const TYPE *src = d + qs[k];                                                     \
                for (Py_ssize_t q = 0; q < m; q++) cp[q] = src[q];                               \
                rc = encode_cached(e, cache, cp, m, qh[k], out);                                 \
            }                                                                                    \
        }                                                                                        \
    } while (0)

#include "_fastbpe_regex.c"  /* Program: a custom pattern's matcher, encode_text_prog */

/* Append the ids of a str (its data read without the GIL: the caller holds a reference). */
static int encode_text(const Encoder *e, Cache *cache, int kind, const void *data, Py_ssize_t len, IdBuf *out) {
    if (e->mode == 3) return encode_text_prog(e, cache, kind, data, len, out);
    Py_UCS4 small[256], *cp = small;
    Py_ssize_t cap = 256;
    int rc = 0, strict = e->mode == 1;  /* cl100k: cut only after a non-space */
    if (kind == PyUnicode_1BYTE_KIND) CHUNK_LOOP(Py_UCS1);
    else if (kind == PyUnicode_2BYTE_KIND) CHUNK_LOOP(Py_UCS2);
    else CHUNK_LOOP(Py_UCS4);
    if (cp != small) PyMem_RawFree(cp);
    return rc;
}

/* The first i' >= i with d[i'] == c, or a position at most 3 before it: 4 UCS2 chars per
 * step with the "has a zero 16-bit lane" test (memchr for UCS2). */
static inline Py_ssize_t skip_to_u16(const Py_UCS2 *d, Py_ssize_t i, Py_ssize_t len, uint16_t c) {
    const uint64_t ones = 0x0001000100010001ULL, highs = 0x8000800080008000ULL, pat = c * ones;
    for (; i + 4 <= len; i += 4) {
        uint64_t v;
        memcpy(&v, d + i, 8);
        v ^= pat;
        if ((v - ones) & ~v & highs) break;
    }
    return i;
}

/* The next special token at or after `from`: its position (longest match wins), or -1.
 * A typed scan for a possible first character, then a compare of each token there. */
#define FIND_SPECIAL(TYPE)                                                                       \
    do {                                                                                         \
        const TYPE *d = (const TYPE *)data;                                                      \
        for (Py_ssize_t i = from; i < len; i++) {                                                \
            if (sizeof(TYPE) == 1 && e->only_first < 256) {                                      \
                const void *hit = memchr(d + i, (int)e->only_first, (size_t)(len - i));          \
                if (!hit) return -1;                                                             \
                i = (const TYPE *)hit - d;                                                       \
            } else {                                                                             \
                if (sizeof(TYPE) == 2 && e->only_first < 256)  /* 4 chars per test */             \
                    i = skip_to_u16((const Py_UCS2 *)(const void *)d, i, len, (uint16_t)e->only_first); \
                while (i < len && (d[i] < 256 ? !e->first[d[i]] : !e->first_wide)) i++;          \
                if (i == len) return -1;                                                         \
            }                                                                                    \
            for (Py_ssize_t k = 0; k < e->nspec; k++) {                                          \
                Py_ssize_t n = e->spec_len[k], q = 0;                                            \
                if (n > len - i) continue;                                                       \
                while (q < n && (Py_UCS4)d[i + q] == e->spec[k][q]) q++;                         \
                if (q == n) { *which = k; return i; }                                            \
            }                                                                                    \
        }                                                                                        \
        return -1;                                                                               \
    } while (0)

static Py_ssize_t find_special(const Encoder *e, int kind, const void *data, Py_ssize_t len, Py_ssize_t from,
                               Py_ssize_t *which) {
    if (kind == PyUnicode_1BYTE_KIND) FIND_SPECIAL(Py_UCS1);
    else if (kind == PyUnicode_2BYTE_KIND) FIND_SPECIAL(Py_UCS2);
    else FIND_SPECIAL(Py_UCS4);
}

/* encode_text, with each special token (if any are set) split off as its own id */
static int encode_text_sp(const Encoder *e, Cache *cache, int kind, const void *data, Py_ssize_t len, IdBuf *out) {
    if (e->nspec == 0) return encode_text(e, cache, kind, data, len, out);
    Py_ssize_t start = 0, k = 0;
    int rc = 0;
    while (rc == 0) {
        Py_ssize_t at = find_special(e, kind, data, len, start, &k);
        Py_ssize_t end = at < 0 ? len : at;
        if (end > start) rc = encode_text(e, cache, kind, (const char *)data + start * kind, end - start, out);
        if (at < 0 || rc < 0) break;
        if ((rc = buf_reserve(out, 1)) < 0) break;
        out->v[out->n++] = e->spec_id[k];
        start = at + e->spec_len[k];
    }
    return rc;
}

/* A custom regex: pretokenize(text) in Python, then BPE of each pre-token (GIL held). */
static int encode_with_callback(Encoder *e, PyObject *text, IdBuf *out) {
    PyObject *words = PyObject_CallOneArg(e->pretokenize, text);
    if (!words) return -1;
    if (!PyList_Check(words)) {
        Py_DECREF(words);
        PyErr_SetString(PyExc_TypeError, "pretokenize must return a list of str");
        return -1;
    }
    for (Py_ssize_t w = 0; w < PyList_GET_SIZE(words); w++) {
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(words, w), &len);
        int rc;
        if (!u || (rc = bpe_bytes(e, (const unsigned char *)u, len, out)) < 0) {
            Py_DECREF(words);
            return u ? raise_err(rc) : -1;
        }
    }
    Py_DECREF(words);
    return 0;
}

static PyObject *ids_to_list(Encoder *e, const int32_t *v, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = e->id_objs[v[i]];
        Py_INCREF(o);
        PyList_SET_ITEM(list, i, o);
    }
    return list;
}

static PyObject *encode_one(Encoder *e, PyObject *text, int specials) {
    if (!PyUnicode_Check(text)) { PyErr_SetString(PyExc_TypeError, "encode() takes a str"); return NULL; }
    IdBuf out = {NULL, 0, 0};
    PyObject *result = NULL;
    if (e->mode < 0) {
        if (encode_with_callback(e, text, &out) == 0) result = ids_to_list(e, out.v, out.n);
        PyMem_RawFree(out.v);
        return result;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    Cache *cache = take_cache(e, len);
    if (!cache) return NULL;
    int rc, kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    int (*f)(const Encoder *, Cache *, int, const void *, Py_ssize_t, IdBuf *) = specials ? encode_text_sp : encode_text;
    if (len < 256) rc = f(e, cache, kind, data, len, &out);  /* not worth a GIL switch */
    else {
        Py_BEGIN_ALLOW_THREADS
        rc = f(e, cache, kind, data, len, &out);
        Py_END_ALLOW_THREADS
    }
    give_cache(e, cache);
    if (rc < 0) raise_err(rc);
    else result = ids_to_list(e, out.v, out.n);
    PyMem_RawFree(out.v);
    return result;
}

static PyObject *Encoder_encode(Encoder *e, PyObject *text) { return encode_one(e, text, 1); }
static PyObject *Encoder_encode_plain(Encoder *e, PyObject *text) { return encode_one(e, text, 0); }

/* The texts of a sequence, checked to be str (a new tuple), or NULL with an error set. */
static PyObject *str_tuple(PyObject *arg, const char *who) {
    PyObject *seq = PySequence_Tuple(arg);
    if (!seq) return NULL;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(seq); t++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(seq, t))) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "%s() takes a sequence of str", who);
            return NULL;
        }
    return seq;
}

/* Encode every text of seq into out in one GIL release, each followed by eot if eot >= 0;
 * ends[t] = out->n after text t.  A C pre-tokenizer only (mode >= 0). */
static int encode_all(Encoder *e, PyObject *seq, int specials, int32_t eot, IdBuf *out, Py_ssize_t *ends) {
    Py_ssize_t nt = PyTuple_GET_SIZE(seq), chars = 0;
    for (Py_ssize_t t = 0; t < nt; t++) chars += PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(seq, t));
    Cache *cache = take_cache(e, chars);
    int rc = buf_reserve(out, chars / 3 + nt + 16);  /* ~4 characters a token in prose: one allocation */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0; t < nt && rc == 0; t++) {
        PyObject *text = PyTuple_GET_ITEM(seq, t);
        int kind = PyUnicode_KIND(text);
        const void *data = PyUnicode_DATA(text);
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        rc = specials ? encode_text_sp(e, cache, kind, data, len, out) : encode_text(e, cache, kind, data, len, out);
        if (rc == 0 && eot >= 0 && (rc = buf_reserve(out, 1)) == 0) out->v[out->n++] = eot;
        ends[t] = out->n;
    }
    Py_END_ALLOW_THREADS
    give_cache(e, cache);
    return rc < 0 ? raise_err(rc) : 0;
}

/* encode_many(texts) -> list of lists: every text in one GIL release (special tokens split). */
static PyObject *Encoder_encode_many(Encoder *e, PyObject *arg) {
    PyObject *seq = str_tuple(arg, "encode_many");
    if (!seq) return NULL;
    Py_ssize_t nt = PyTuple_GET_SIZE(seq);
    if (e->mode < 0) {  /* a custom regex: one at a time, with the GIL */
        PyObject *res = PyList_New(nt);
        for (Py_ssize_t t = 0; res && t < nt; t++) {
            PyObject *ids = Encoder_encode(e, PyTuple_GET_ITEM(seq, t));
            if (!ids) { Py_CLEAR(res); break; }
            PyList_SET_ITEM(res, t, ids);
        }
        Py_DECREF(seq);
        return res;
    }
    Py_ssize_t *ends = PyMem_RawMalloc((size_t)(nt + 1) * sizeof(Py_ssize_t));
    if (!ends) { Py_DECREF(seq); return PyErr_NoMemory(); }
    IdBuf out = {NULL, 0, 0};
    PyObject *res = NULL;
    if (encode_all(e, seq, 1, -1, &out, ends) == 0 && (res = PyList_New(nt)) != NULL) {
        Py_ssize_t begin = 0;
        for (Py_ssize_t t = 0; t < nt; t++) {
            PyObject *ids = ids_to_list(e, out.v + begin, ends[t] - begin);
            if (!ids) { Py_CLEAR(res); break; }
            /* a list of ints is in no reference cycle: untracked, the cyclic collector does not
             * walk every id of every new list (30% of encode_batch over 180 MB; 0 with it off) */
            PyObject_GC_UnTrack(ids);
            PyList_SET_ITEM(res, t, ids);
            begin = ends[t];
        }
    }
    PyMem_RawFree(out.v);
    PyMem_RawFree(ends);
    Py_DECREF(seq);
    return res;
}

/* UTF-8 bytes of a str's characters (a lone surrogate counts 3, as "surrogatepass" writes it). */
static Py_ssize_t utf8_length(PyObject *text) {
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), bytes = n;
    if (PyUnicode_IS_ASCII(text)) return n;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        bytes += (c >= 0x80) + (c >= 0x800) + (c >= 0x10000);
    }
    return bytes;
}

/* encode_flat(texts, eot, itemsize, specials) -> (tokens, lengths, utf8_bytes): every text's
 * ids, each followed by eot (if >= 0), as one buffer of uint16 or uint32 (itemsize 2 or 4),
 * its per-text lengths as int64 bytes, and the texts' UTF-8 size.  No int object is made, so
 * threads spend all but the final copy without the GIL (what ingest's encoders need). */
static PyObject *Encoder_encode_flat(Encoder *e, PyObject *args) {
    PyObject *arg, *seq, *tokens = NULL, *lengths = NULL;
    int eot, itemsize, specials;
    if (!PyArg_ParseTuple(args, "Oiip", &arg, &eot, &itemsize, &specials)) return NULL;
    if (e->mode < 0) { PyErr_SetString(PyExc_ValueError, "encode_flat needs a C pre-tokenizer"); return NULL; }
    if ((itemsize != 2 && itemsize != 4) || (itemsize == 2 && e->n_ids > 0x10000) || eot >= e->n_ids) {
        PyErr_SetString(PyExc_ValueError, "encode_flat: itemsize must be 2 (ids < 65536) or 4, eot an id or -1");
        return NULL;
    }
    if (!(seq = str_tuple(arg, "encode_flat"))) return NULL;
    Py_ssize_t nt = PyTuple_GET_SIZE(seq), utf8 = 0;
    for (Py_ssize_t t = 0; t < nt; t++) utf8 += utf8_length(PyTuple_GET_ITEM(seq, t));
    Py_ssize_t *ends = PyMem_RawMalloc((size_t)(nt + 1) * sizeof(Py_ssize_t));
    if (!ends) { Py_DECREF(seq); return PyErr_NoMemory(); }
    IdBuf out = {NULL, 0, 0};
    if (encode_all(e, seq, specials, eot, &out, ends) == 0
        && (tokens = PyBytes_FromStringAndSize(NULL, out.n * itemsize)) != NULL
        && (lengths = PyBytes_FromStringAndSize(NULL, nt * (Py_ssize_t)sizeof(int64_t))) != NULL) {
        char *dst = PyBytes_AS_STRING(tokens);
        int64_t *len = (int64_t *)(void *)PyBytes_AS_STRING(lengths);
        Py_BEGIN_ALLOW_THREADS
        if (itemsize == 4) memcpy(dst, out.v, (size_t)out.n * 4);
        else for (Py_ssize_t i = 0; i < out.n; i++) ((uint16_t *)(void *)dst)[i] = (uint16_t)out.v[i];
        for (Py_ssize_t t = 0; t < nt; t++) len[t] = ends[t] - (t ? ends[t - 1] : 0);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(out.v);
    PyMem_RawFree(ends);
    Py_DECREF(seq);
    if (!lengths) { Py_XDECREF(tokens); return NULL; }
    return Py_BuildValue("NNn", tokens, lengths, utf8);
}

static void free_specials(Encoder *e) {
    for (Py_ssize_t k = 0; k < e->nspec; k++) PyMem_Free(e->spec[k]);
    PyMem_Free(e->spec); PyMem_Free(e->spec_len); PyMem_Free(e->spec_id);
    e->spec = NULL; e->spec_len = NULL; e->spec_id = NULL; e->nspec = 0;
    memset(e->first, 0, sizeof(e->first)); e->first_wide = 0; e->only_first = 0x110000;
}

/* set_specials([(token, id), ...]): encode and encode_many split these off (longest wins) */
static PyObject *Encoder_set_specials(Encoder *e, PyObject *arg) {
    if (e->mode < 0) { PyErr_SetString(PyExc_ValueError, "set_specials needs a C pre-tokenizer"); return NULL; }
    PyObject *seq = PySequence_Fast(arg, "set_specials takes a sequence of (str, id)");
    if (!seq) return NULL;
    if (__atomic_load_n(&e->active, __ATOMIC_ACQUIRE)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_RuntimeError, "set_specials(): the encoder is in use");
        return NULL;
    }
    free_specials(e);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    e->spec = PyMem_Calloc((size_t)n + 1, sizeof(Py_UCS4 *));
    e->spec_len = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    e->spec_id = PyMem_Calloc((size_t)n + 1, sizeof(int32_t));
    if (!e->spec || !e->spec_len || !e->spec_id) { Py_DECREF(seq); free_specials(e); return PyErr_NoMemory(); }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *tok;
        Py_ssize_t id;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "Un", &tok, &id)) goto fail;
        if (id < 0 || id >= e->n_ids || PyUnicode_GET_LENGTH(tok) == 0) {
            PyErr_SetString(PyExc_ValueError, "a special token must be non-empty, its id in the vocab");
            goto fail;
        }
        Py_ssize_t len = PyUnicode_GET_LENGTH(tok), at = e->nspec;
        while (at > 0 && e->spec_len[at - 1] < len) {  /* insertion sort: longest first */
            e->spec[at] = e->spec[at - 1]; e->spec_len[at] = e->spec_len[at - 1]; e->spec_id[at] = e->spec_id[at - 1];
            at--;
        }
        if (!(e->spec[at] = PyUnicode_AsUCS4Copy(tok))) { e->nspec++; goto fail; }
        e->spec_len[at] = len; e->spec_id[at] = (int32_t)id;
        e->nspec++;
        Py_UCS4 c = e->spec[at][0];
        if (c < 256) e->first[c] = 1; else e->first_wide = 1;
        e->only_first = k == 0 ? c : (e->only_first == c ? c : 0x110000);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    free_specials(e);
    return NULL;
}

static PyObject *Encoder_bpe(Encoder *e, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    IdBuf out = {NULL, 0, 0};
    PyObject *result = NULL;
    int rc = bpe_bytes(e, view.buf, view.len, &out);
    if (rc == 0) result = ids_to_list(e, out.v, out.n);
    else raise_err(rc);
    PyBuffer_Release(&view);
    PyMem_RawFree(out.v);
    return result;
}

static void free_words(Encoder *e) {
    if (!e->words) return;
    for (uint64_t i = 0; i <= e->word_mask; i++) PyMem_Free(e->words[i].bytes);
    PyMem_Free(e->words);
    e->words = NULL; e->word_max = 0;
}

/* set_words([(bytes, id)]): pre-tokens encoded as one id, before BPE.  Called once, before use. */
static PyObject *Encoder_set_words(Encoder *e, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "set_words takes a list of (bytes, id)");
    if (!seq) return NULL;
    Py_ssize_t nw = PySequence_Fast_GET_SIZE(seq);
    free_words(e);
    cache_clear(e->cache);
    if (nw == 0) { Py_DECREF(seq); Py_RETURN_NONE; }
    uint64_t size = 16;
    while (size < 2 * (uint64_t)nw + 1) size *= 2;
    e->words = PyMem_Calloc(size, sizeof(WordSlot));
    if (!e->words) { Py_DECREF(seq); return PyErr_NoMemory(); }
    e->word_mask = size - 1;
    for (Py_ssize_t k = 0; k < nw; k++) {
        const char *buf; Py_ssize_t len; int id;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "y#i", &buf, &len, &id)) goto fail;
        if (len < 1 || len > 0x7fffffff || id < 0) { PyErr_SetString(PyExc_ValueError, "bad word"); goto fail; }
        uint64_t h = bytes_hash((const unsigned char *)buf, len), i = h & e->word_mask;
        while (e->words[i].hash) i = (i + 1) & e->word_mask;
        if (!(e->words[i].bytes = PyMem_Malloc((size_t)len))) { PyErr_NoMemory(); goto fail; }
        memcpy(e->words[i].bytes, buf, (size_t)len);
        e->words[i].hash = h; e->words[i].id = id; e->words[i].len = (int32_t)len;
        if (len > e->word_max) e->word_max = len;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    free_words(e);
    return NULL;
}

static PyObject *Encoder_clear(Encoder *e, PyObject *Py_UNUSED(ignored)) {
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(e->lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
    int busy = __atomic_load_n(&e->active, __ATOMIC_ACQUIRE) != 0;
    if (!busy) cache_clear(e->cache);
    PyThread_release_lock(e->lock);
    if (busy) { PyErr_SetString(PyExc_RuntimeError, "clear(): the encoder is in use by another thread"); return NULL; }
    Py_RETURN_NONE;
}

static PyObject *Encoder_cached(Encoder *e, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(e->lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
    n = e->cache->used;
    PyThread_release_lock(e->lock);
    return PyLong_FromSsize_t(n);
}

static int Encoder_init(Encoder *e, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"merges", "byte_ids", "pretokenize", "cache_entries", "max_cached_chunk", "mode",
                             "n_ids", "program", NULL};
    PyObject *merges, *byte_ids, *pretokenize, *program = Py_None;
    Py_ssize_t cache_entries = 1 << 19, max_cached = 128, n_ids = 0;
    int mode = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|nninO", kwlist, &merges, &byte_ids, &pretokenize,
                                     &cache_entries, &max_cached, &mode, &n_ids, &program))
        return -1;
    if (e->merges) { PyErr_SetString(PyExc_RuntimeError, "Encoder is already initialised"); return -1; }
    if (mode < -1 || mode > 3) { PyErr_SetString(PyExc_ValueError, "mode must be -1, 0, 1, 2 or 3"); return -1; }
    if (mode >= 0 && mode < 3 && !uclass) { PyErr_SetString(PyExc_RuntimeError, "call set_classes() first"); return -1; }
    if ((mode == 3) != PyObject_TypeCheck(program, &ProgramType) || (mode == 3 && !((ProgramObject *)program)->p.code)) {
        PyErr_SetString(PyExc_ValueError, "mode 3 takes an initialised Program (program=), other modes none");
        return -1;
    }
    e->mode = mode;
    if (mode == 3) { Py_INCREF(program); e->program = program; e->prog = &((ProgramObject *)program)->p; }
    e->only_first = 0x110000;
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
        int a, b, m, rank = (int)r;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, r);
        if (!PyArg_ParseTuple(item, "iii|i", &a, &b, &m, &rank)) { Py_DECREF(seq); return -1; }
        if (PyTuple_GET_SIZE(item) == 4) e->one_at_a_time = 1;
        if (a < 0 || b < 0 || m < 0 || rank < 0) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "negative id"); return -1; }
        max_id = a > max_id ? a : max_id; max_id = b > max_id ? b : max_id; max_id = m > max_id ? m : max_id;
        uint64_t key = pair_key(a, b), i = mix64(key) & e->merge_mask;
        while (e->merges[i].key && e->merges[i].key != key) i = (i + 1) & e->merge_mask;
        if (e->merges[i].key == 0) {  /* a repeated merge keeps its first rank */
            e->merges[i].key = key; e->merges[i].rank = (int32_t)rank; e->merges[i].merged = m;
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
    if (n_ids > 0x110000) { PyErr_SetString(PyExc_ValueError, "n_ids out of range"); return -1; }
    e->n_ids = (Py_ssize_t)max_id + 1 > n_ids ? (Py_ssize_t)max_id + 1 : n_ids;  /* special ids too */
    e->id_objs = PyMem_Calloc((size_t)e->n_ids, sizeof(PyObject *));
    if (!e->id_objs) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < e->n_ids; i++)
        if (!(e->id_objs[i] = PyLong_FromSsize_t(i))) return -1;
    Py_INCREF(pretokenize);
    e->pretokenize = pretokenize;
    e->cache_limit = cache_entries < 1 ? 1 : cache_entries;
    e->max_cached_chunk = max_cached;
    if (!(e->lock = PyThread_allocate_lock())) { PyErr_NoMemory(); return -1; }
    if (!(e->cache = cache_new(e->cache_limit))) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void Encoder_dealloc(Encoder *e) {
    if (e->cache) cache_free(e->cache);
    if (e->lock) PyThread_free_lock(e->lock);
    PyMem_Free(e->merges);
    free_words(e);
    if (e->id_objs) {
        for (Py_ssize_t i = 0; i < e->n_ids; i++) Py_XDECREF(e->id_objs[i]);
        PyMem_Free(e->id_objs);
    }
    Py_XDECREF(e->pretokenize);
    Py_XDECREF(e->program);
    free_specials(e);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *Encoder_ready(Encoder *e, PyObject *(*f)(Encoder *, PyObject *), PyObject *arg) {
    if (!e->merges || !e->id_objs || !e->cache || !e->lock) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder was not initialised");
        return NULL;
    }
    return f(e, arg);
}

static PyObject *m_encode(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_encode, arg); }
static PyObject *m_encode_many(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_encode_many, arg); }
static PyObject *m_encode_plain(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_encode_plain, arg); }
static PyObject *m_set_specials(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_set_specials, arg); }
static PyObject *m_bpe(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_bpe, arg); }
static PyObject *m_set_words(PyObject *self, PyObject *arg) { return Encoder_ready((Encoder *)self, Encoder_set_words, arg); }
static PyObject *m_encode_flat(PyObject *self, PyObject *args) { return Encoder_ready((Encoder *)self, Encoder_encode_flat, args); }

static PyMethodDef Encoder_methods[] = {
    {"encode", m_encode, METH_O, "encode(text: str) -> list[int]: ids of text, special tokens (set_specials) split off."},
    {"encode_many", m_encode_many, METH_O, "encode_many(texts) -> list[list[int]]: encode each, GIL released once."},
    {"encode_plain", m_encode_plain, METH_O, "encode_plain(text) -> list[int]: special-token strings as plain text."},
    {"set_specials", m_set_specials, METH_O, "set_specials([(token, id)]): encode/encode_many split these off."},
    {"encode_flat", m_encode_flat, METH_VARARGS,
     "encode_flat(texts, eot, itemsize, specials) -> (tokens: bytes, lengths: bytes of int64, utf8_bytes: int)."},
    {"bpe", m_bpe, METH_O, "bpe(pretoken: bytes) -> list[int]: BPE of one pre-token's UTF-8 bytes."},
    {"set_words", m_set_words, METH_O, "set_words([(bytes, id)]): these whole pre-tokens are one id (before BPE)."},
    {"clear", (PyCFunction)Encoder_clear, METH_NOARGS, "Empty the chunk caches."},
    {"cached", (PyCFunction)Encoder_cached, METH_NOARGS, "Number of chunks in the caches."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmdata.tokenizer._fastbpe.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encoder(merges, byte_ids, pretokenize, cache_entries=524288, max_cached_chunk=128, mode=0, n_ids=0, "
               "program=None)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = Encoder_methods,
};

static PyObject *set_classes(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len != 0x110000) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "set_classes needs one byte per code point (0x110000)");
        return NULL;
    }
    if (!uclass) uclass = PyMem_RawMalloc(0x110000);  /* kept for the life of the process */
    if (!uclass) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
    memcpy(uclass, view.buf, 0x110000);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *pretokenize(PyObject *self, PyObject *args) {
    PyObject *text;
    int mode;
    if (!PyArg_ParseTuple(args, "Ui", &text, &mode)) return NULL;
    if (mode < 0 || mode > 2 || !uclass) { PyErr_SetString(PyExc_ValueError, "bad mode, or set_classes() not called"); return NULL; }
    Py_UCS4 *c = PyUnicode_AsUCS4Copy(text);
    if (!c) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < n;) {
        Py_ssize_t len = MATCHERS[mode](c, i, n);
        PyObject *w = PyUnicode_Substring(text, i, i + len);
        if (!w || PyList_Append(out, w) < 0) Py_CLEAR(out);
        Py_XDECREF(w);
        i += len;
    }
    PyMem_Free(c);
    return out;
}

#include "_fastbpe_train.c"  /* ChunkCounter and train(): the trainer */

/* ---------------------------------------------------------------- module */

static PyMethodDef module_methods[] = {
    {"set_classes", set_classes, METH_O, "set_classes(table: bytes): the class byte of every code point."},
    {"pretokenize", pretokenize, METH_VARARGS, "pretokenize(text, mode) -> list[str]: the C pre-tokenizer (tests)."},
    TRAIN_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastbpe_module = {
    PyModuleDef_HEAD_INIT, "_fastbpe", "Compiled BPE encoding and training loops for lmdata.tokenizer.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastbpe(void) {
    if (PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fastbpe_module);
    if (!m) return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyType_Ready(&ProgramType) < 0) { Py_DECREF(m); return NULL; }
    Py_INCREF(&ProgramType);
    if (PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(&ProgramType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyType_Ready(&ChunkCounterType) < 0) { Py_DECREF(m); return NULL; }
    Py_INCREF(&ChunkCounterType);
    if (PyModule_AddObject(m, "ChunkCounter", (PyObject *)&ChunkCounterType) < 0) {
        Py_DECREF(&ChunkCounterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
