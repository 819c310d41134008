/* _fastbpe_regex.c: the C matcher for a custom pre-tokenizer regex, #included by _fastbpe.c.
 *
 * Program(code, n_instr, entries, table) holds what regex_program.py compiled from the pattern
 * (one entry), or from a chain of regexes (one entry each: every piece the steps before made is
 * cut into the next one's matches and the text between them, as Hugging Face's isolating Splits do):
 * instructions of 8 int32s [op, next, a, b, c, d, e, 0], built back to front, so every pc an
 * instruction names is below its own (no cycles: the recursion depth is at most n_instr, and
 * a repeat of one class is a loop, not a recursion).  A backtracking matcher with the
 * semantics of the `regex` module (leftmost-first alternation; greedy, lazy and possessive
 * repeats; atomic groups; look-aheads):
 *   SUCCEED                       the match ends here
 *   SET next kind arg lo hi mode  lo..hi (hi -1: any) characters of a class: kind 0 = bit arg
 *                                 of table[c] (uint32 per code point), 1 = the list at code[arg]
 *                                 ([count, c1, ...]); mode 0 greedy, 1 lazy, 2 possessive
 *   SPLIT - x y kind arg          try x, then y; with kind >= 0 (a class, as SET's), x only where
 *                                 the next character is in it (what every match of x starts with)
 *   ATOMIC next sub               the first match of sub, never revisited
 *   LOOKNEG / LOOKPOS next sub    sub must fail / match here; consumes nothing
 *   BOS, EOS, DOLLAR next         start; end; end or before a final "\n"
 * The pattern cannot match the empty string (the compiler refuses one that can), so each
 * match moves on.  A match that takes more than a budget of steps (catastrophic backtracking)
 * is an error, ERR_BACKTRACK, not a hang.  Everything here runs without the GIL.
 */

enum { OP_SUCCEED, OP_SET, OP_SPLIT, OP_ATOMIC, OP_LOOKNEG, OP_LOOKPOS, OP_BOS, OP_EOS, OP_DOLLAR, OP_COUNT };
enum { Q_GREEDY, Q_LAZY, Q_POSSESSIVE };
#define INS_W 8
#define VM_FAIL -1
#define VM_BLOWUP -2

typedef struct { PyObject_HEAD Prog p; } ProgramObject;

typedef struct { const Prog *p; const Py_UCS4 *s; Py_ssize_t n; int64_t budget; } VM;

/* c in the class (kind 0: bit arg of the table; 1: the list at code[arg]) */
static inline int in_class(const Prog *p, int32_t kind, int32_t arg, Py_UCS4 c) {
    if (kind == 0) return c < 0x110000 && (p->table[c] >> arg & 1u);
    const int32_t *l = p->code + arg;
    for (int32_t k = 1; k <= l[0]; k++) if ((Py_UCS4)l[k] == c) return 1;
    return 0;
}

/* The end of a match of the program from pc at pos, or VM_FAIL / VM_BLOWUP. */
static Py_ssize_t vm_run(VM *vm, int32_t pc, Py_ssize_t pos) {
    const Prog *p = vm->p;
    for (;;) {
        if (--vm->budget < 0) return VM_BLOWUP;
        const int32_t *ins = p->code + (size_t)pc * INS_W;
        Py_ssize_t r;
        switch (ins[0]) {
        case OP_SUCCEED: return pos;
        case OP_SET: {
            Py_ssize_t lo = ins[4], hi = ins[5], k = 0, avail = vm->n - pos;
            if (hi < 0 || hi > avail) hi = avail;
            while (k < hi && in_class(p, ins[2], ins[3], vm->s[pos + k])) k++;
            if (k < lo) return VM_FAIL;
            int32_t next = ins[1];
            if (p->code[(size_t)next * INS_W] == OP_SUCCEED) return pos + (ins[6] == Q_LAZY ? lo : k);
            if (ins[6] == Q_POSSESSIVE) { pos += k; pc = next; break; }
            if (ins[6] == Q_GREEDY) {
                for (Py_ssize_t j = k; j > lo; j--)
                    if ((r = vm_run(vm, next, pos + j)) != VM_FAIL) return r;
                pos += lo;
            } else {
                for (Py_ssize_t j = lo; j < k; j++)
                    if ((r = vm_run(vm, next, pos + j)) != VM_FAIL) return r;
                pos += k;
            }
            pc = next;
            break;
        }
        case OP_SPLIT:  /* a guard (kind ins[4] >= 0): x can only start with a character of that class */
            if (ins[4] >= 0 && (pos >= vm->n || !in_class(p, ins[4], ins[5], vm->s[pos]))) { pc = ins[3]; break; }
            if ((r = vm_run(vm, ins[2], pos)) != VM_FAIL) return r;
            pc = ins[3];
            break;
        case OP_ATOMIC:
            if ((r = vm_run(vm, ins[2], pos)) < 0) return r;
            pos = r; pc = ins[1];
            break;
        case OP_LOOKNEG:
        case OP_LOOKPOS:
            r = vm_run(vm, ins[2], pos);
            if (r == VM_BLOWUP) return r;
            if ((r >= 0) == (ins[0] == OP_LOOKNEG)) return VM_FAIL;
            pc = ins[1];
            break;
        case OP_BOS: if (pos != 0) return VM_FAIL; pc = ins[1]; break;
        case OP_EOS: if (pos != vm->n) return VM_FAIL; pc = ins[1]; break;
        default:  /* OP_DOLLAR */
            if (!(pos == vm->n || (pos == vm->n - 1 && vm->s[pos] == '\n'))) return VM_FAIL;
            pc = ins[1];
            break;
        }
    }
}

/* The length of step k's match at s[i] (> 0), or 0 (none), or ERR_BACKTRACK. */
static Py_ssize_t step_match(const Prog *p, int k, const Py_UCS4 *s, Py_ssize_t i, Py_ssize_t n) {
    VM vm = {p, s, n, ((int64_t)1 << 20) + 64 * (int64_t)(n - i)};
    Py_ssize_t r = vm_run(&vm, p->entry[k], i);
    return r > i ? r - i : r == VM_BLOWUP ? ERR_BACKTRACK : 0;
}

typedef struct { Py_ssize_t *v; Py_ssize_t n, cap; } Ends;

static int ends_push(Ends *e, Py_ssize_t x) {
    if (e->n == e->cap) {
        Py_ssize_t cap = e->cap ? 2 * e->cap : 256;
        Py_ssize_t *v = PyMem_RawRealloc(e->v, (size_t)cap * sizeof(Py_ssize_t));
        if (!v) return ERR_NOMEM;
        e->v = v; e->cap = cap;
    }
    e->v[e->n++] = x;
    return 0;
}

/* A chain: the ends of the pieces steps k.. cut s[a:b) into (each step sees a piece as its whole text). */
static int chain_split(const Prog *p, int k, const Py_UCS4 *s, Py_ssize_t a, Py_ssize_t b, Ends *out) {
    if (k == p->nsteps) return ends_push(out, b);
    Py_ssize_t at = 0, n = b - a;
    int rc = 0;
    for (Py_ssize_t pos = 0; pos < n && rc == 0;) {
        Py_ssize_t r = step_match(p, k, s + a, pos, n);
        if (r < 0) return (int)r;
        if (r == 0) { pos++; continue; }
        if (pos > at) rc = chain_split(p, k + 1, s, a + at, a + pos, out);
        if (rc == 0) rc = chain_split(p, k + 1, s, a + pos, a + pos + r, out);
        at = pos += r;
    }
    if (rc == 0 && at < n) rc = chain_split(p, k + 1, s, a + at, b, out);
    return rc;
}

/* The length of the match at s[i] (> 0), or ERR_NOMATCH / ERR_BACKTRACK (one regex, not a chain). */
static Py_ssize_t prog_match(const Prog *p, const Py_UCS4 *s, Py_ssize_t i, Py_ssize_t n) {
    VM vm = {p, s, n, (int64_t)1 << 20};
    vm.budget += 64 * (int64_t)(n - i);
    Py_ssize_t r = vm_run(&vm, p->entry[0], i);
    if (r > i) return r - i;
    if (r == VM_BLOWUP) return ERR_BACKTRACK;
    nomatch_char = s[i]; nomatch_at = i;
    return ERR_NOMATCH;
}

static int class_check(const Prog *p, int32_t kind, int32_t arg) {
    if (kind == 0) return p->table && arg >= 0 && arg <= 31 ? 0 : -1;
    if (kind != 1 || arg < p->ninstr * INS_W || arg >= p->ncode || p->code[arg] < 0
        || arg + 1 + (Py_ssize_t)p->code[arg] > p->ncode) return -1;
    return 0;
}

/* Every pc an instruction names is an instruction below it; lists lie inside the code. */
static int prog_check(const Prog *p) {
    if (p->ninstr < 1 || p->ninstr * INS_W > p->ncode || p->nsteps < 1 || p->nsteps > MAX_STEPS) return -1;
    for (int k = 0; k < p->nsteps; k++) if (p->entry[k] < 0 || p->entry[k] >= p->ninstr) return -1;
    if (p->code[0] != OP_SUCCEED) return -1;
    for (Py_ssize_t pc = 1; pc < p->ninstr; pc++) {
        const int32_t *ins = p->code + pc * INS_W;
        int op = ins[0];
        if (op <= OP_SUCCEED || op >= OP_COUNT) return -1;
        if (op != OP_SPLIT && (ins[1] < 0 || ins[1] >= pc)) return -1;
        if ((op == OP_SPLIT || op == OP_ATOMIC || op == OP_LOOKNEG || op == OP_LOOKPOS) && (ins[2] < 0 || ins[2] >= pc))
            return -1;
        if (op == OP_SPLIT && (ins[3] < 0 || ins[3] >= pc)) return -1;
        if (op == OP_SPLIT && ins[4] != -1 && class_check(p, ins[4], ins[5]) < 0) return -1;
        if (op != OP_SET) continue;
        if (ins[4] < 0 || ins[5] < -1 || (ins[5] >= 0 && ins[5] < ins[4]) || ins[6] < 0 || ins[6] > Q_POSSESSIVE) return -1;
        if (class_check(p, ins[2], ins[3]) < 0) return -1;
    }
    return 0;
}

static int Program_init(ProgramObject *o, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"code", "n_instr", "entries", "table", NULL};
    Py_buffer code, table = {0};
    Py_ssize_t ninstr, entry[MAX_STEPS];
    PyObject *table_obj, *entries;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*nOO", kwlist, &code, &ninstr, &entries, &table_obj)) return -1;
    if (o->p.code) { PyBuffer_Release(&code); PyErr_SetString(PyExc_RuntimeError, "Program is already initialised"); return -1; }
    PyObject *seq = PySequence_Fast(entries, "entries must be a sequence of ints");
    Py_ssize_t nsteps = seq ? PySequence_Fast_GET_SIZE(seq) : -1;
    for (Py_ssize_t k = 0; k < nsteps && k < MAX_STEPS; k++) entry[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, k));
    Py_XDECREF(seq);
    if (PyErr_Occurred()) { PyBuffer_Release(&code); return -1; }
    if (table_obj != Py_None && PyObject_GetBuffer(table_obj, &table, PyBUF_SIMPLE) < 0) { PyBuffer_Release(&code); return -1; }
    int bad = code.len % 4 || (table_obj != Py_None && table.len != 0x110000 * 4) || nsteps < 1 || nsteps > MAX_STEPS;
    for (Py_ssize_t k = 0; !bad && k < nsteps; k++) bad = entry[k] < 0 || entry[k] > 0x7fffffff;
    if (!bad) {
        o->p.code = PyMem_RawMalloc((size_t)code.len + 4);
        o->p.table = table_obj == Py_None ? NULL : PyMem_RawMalloc(0x110000 * 4);
        if (!o->p.code || (table_obj != Py_None && !o->p.table)) {
            PyBuffer_Release(&code); if (table_obj != Py_None) PyBuffer_Release(&table);
            PyErr_NoMemory(); return -1;
        }
        memcpy(o->p.code, code.buf, (size_t)code.len);
        if (o->p.table) memcpy(o->p.table, table.buf, 0x110000 * 4);
        o->p.ncode = code.len / 4; o->p.ninstr = ninstr; o->p.nsteps = (int)nsteps;
        for (Py_ssize_t k = 0; k < nsteps; k++) o->p.entry[k] = (int32_t)entry[k];
        bad = prog_check(&o->p);
    }
    PyBuffer_Release(&code);
    if (table_obj != Py_None) PyBuffer_Release(&table);
    if (bad) { PyErr_SetString(PyExc_ValueError, "Program: malformed code or table"); return -1; }
    return 0;
}

static void Program_dealloc(ProgramObject *o) {
    PyMem_RawFree(o->p.code);
    PyMem_RawFree(o->p.table);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

/* findall(text) -> list[str]: the pre-tokens (tests; the encoder never makes these strs) */
static PyObject *Program_findall(ProgramObject *o, PyObject *text) {
    if (!o->p.code) { PyErr_SetString(PyExc_RuntimeError, "Program was not initialised"); return NULL; }
    if (!PyUnicode_Check(text)) { PyErr_SetString(PyExc_TypeError, "findall() takes a str"); return NULL; }
    Py_UCS4 *c = PyUnicode_AsUCS4Copy(text);
    if (!c) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Ends ends = {NULL, 0, 0};
    int rc = 0;
    if (o->p.nsteps > 1) rc = chain_split(&o->p, 0, c, 0, n, &ends);
    for (Py_ssize_t i = 0; o->p.nsteps == 1 && rc == 0 && i < n;) {
        Py_ssize_t len = prog_match(&o->p, c, i, n);
        if (len < 0 || (rc = ends_push(&ends, i + len)) < 0) rc = len < 0 ? (int)len : rc;
        i += len;
    }
    PyMem_Free(c);
    PyObject *out = rc < 0 ? (raise_err(rc), NULL) : PyList_New(ends.n);
    for (Py_ssize_t k = 0; out && k < ends.n; k++) {
        PyObject *w = PyUnicode_Substring(text, k ? ends.v[k - 1] : 0, ends.v[k]);
        if (!w) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, w);
    }
    PyMem_RawFree(ends.v);
    return out;
}

static PyMethodDef Program_methods[] = {
    {"findall", (PyCFunction)Program_findall, METH_O, "findall(text) -> list[str]: the pre-tokens of text."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmdata.tokenizer._fastbpe.Program",
    .tp_basicsize = sizeof(ProgramObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Program(code: bytes, n_instr, entries, table: bytes | None): a compiled pre-tokenizer regex or chain.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Program_init,
    .tp_dealloc = (destructor)Program_dealloc,
    .tp_methods = Program_methods,
};

/* The characters of a str as code points, into *buf (grown as needed; *cap code points). */
static int to_ucs4(int kind, const void *data, Py_ssize_t len, Py_UCS4 **buf, Py_ssize_t *cap, Py_UCS4 *small) {
    if (len > *cap) {
        Py_UCS4 *bigger = PyMem_RawMalloc((size_t)len * sizeof(Py_UCS4));
        if (!bigger) return ERR_NOMEM;
        if (*buf != small) PyMem_RawFree(*buf);
        *buf = bigger; *cap = len;
    }
    Py_UCS4 *d = *buf;
    if (kind == PyUnicode_1BYTE_KIND) for (Py_ssize_t i = 0; i < len; i++) d[i] = ((const Py_UCS1 *)data)[i];
    else if (kind == PyUnicode_2BYTE_KIND) for (Py_ssize_t i = 0; i < len; i++) d[i] = ((const Py_UCS2 *)data)[i];
    else memcpy(d, data, (size_t)len * sizeof(Py_UCS4));
    return 0;
}

/* encode_text for a Program: each pre-token is a "chunk" of the cache (a custom regex has no
 * known cut points), a batch of 16 matched and their slots prefetched before any lookup. */
static int encode_text_prog(const Encoder *e, Cache *cache, int kind, const void *data, Py_ssize_t len, IdBuf *out) {
    Py_UCS4 small[1024], *cp = small;
    Py_ssize_t cap = 1024, qs[BATCH + 1];
    uint64_t qh[BATCH];
    int rc = to_ucs4(kind, data, len, &cp, &cap, small), chain = e->prog->nsteps > 1;
    Ends ends = {NULL, 0, 0};  /* a chain: every piece's end, first */
    Py_ssize_t next = 0;
    if (rc == 0 && chain) rc = chain_split(e->prog, 0, cp, 0, len, &ends);
    for (Py_ssize_t i = 0; i < len && rc == 0;) {
        int nq = 0, r2;
        qs[0] = i;
        while (nq < BATCH && i < len) {
            Py_ssize_t m = chain ? ends.v[next++] - i : prog_match(e->prog, cp, i, len);
            if (m < 0) { rc = (int)m; break; }
            uint64_t hash = 0xcbf29ce484222325ULL;
            for (Py_ssize_t q = i; q < i + m; q++) hash = (hash ^ cp[q]) * 0x100000001b3ULL;
            qh[nq] = mix64(hash);
            __builtin_prefetch(&cache->slots[qh[nq] & cache->mask]);
            qs[++nq] = i += m;
        }
        for (int k = 0; k < nq && rc >= 0; k++)
            if ((r2 = encode_cached(e, cache, cp + qs[k], qs[k + 1] - qs[k], qh[k], out)) < 0) rc = r2;
    }
    if (cp != small) PyMem_RawFree(cp);
    PyMem_RawFree(ends.v);
    return rc;
}
