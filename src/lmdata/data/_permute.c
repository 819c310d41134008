/* _permute: Permutation.__call__ in C (lmdata.data.permutation), the same bijection bit for bit.
 *
 * permute(indices, out, n, mask, s1, s2, keys) writes, for each int64 index x in indices (each
 * already in [0, n)), the value the NumPy path computes: the 4-round keyed hash of the domain
 * [0, mask + 1) applied until it lands below n (cycle-walking). keys is a uint64 buffer of
 * 4 * rounds words (k_xor, k_mul1, k_add, k_mul2 per round). Every step wraps modulo 2^64 and is
 * masked as in NumPy's uint64 arithmetic.
 *
 * Why: a mixture's read locates its 128 indices per source and pass, a few dozen elements per
 * call, where NumPy's per-operation overhead (32 array operations a round trip, two or three
 * trips of cycle-walking) was ~27 us a call: half of a 2-source mixture's loader time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static inline uint64_t encrypt(uint64_t x, uint64_t mask, unsigned s1, unsigned s2,
                               const uint64_t *keys, Py_ssize_t rounds) {
    for (Py_ssize_t r = 0; r < rounds; r++) {
        const uint64_t *k = keys + 4 * r;
        x ^= k[0];
        x *= k[1];
        x &= mask;
        x ^= x >> s1;
        x += k[2];
        x *= k[3];
        x &= mask;
        x ^= x >> s2;
    }
    return x;
}

static PyObject *permute(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer in = {0}, out = {0}, keys = {0};
    unsigned long long n, mask;
    unsigned int s1, s2;
    if (!PyArg_ParseTuple(args, "y*w*KKIIy*", &in, &out, &n, &mask, &s1, &s2, &keys))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = in.len / 8, rounds = keys.len / 32;
    if (in.len % 8 || out.len < in.len || keys.len % 32 || rounds < 1 || s1 > 63 || s2 > 63 || n > mask + 1ULL) {
        PyErr_SetString(PyExc_ValueError, "permute: indices and out must be int64 buffers of one length, keys 4 * rounds uint64 words, n <= mask + 1");
        goto done;
    }
    const int64_t *src = in.buf;
    uint64_t *dst = out.buf;
    const uint64_t *k = keys.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (src[i] < 0 || (uint64_t)src[i] >= n) {
            PyErr_Format(PyExc_IndexError, "permutation index out of range [0, %llu)", n);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t x = encrypt((uint64_t)src[i], mask, s1, s2, k, rounds);
        while (x >= n)  /* terminates: the start value is below n and the hash is a bijection */
            x = encrypt(x, mask, s1, s2, k, rounds);
        dst[i] = x;
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    PyBuffer_Release(&keys);
    return result;
}

static PyMethodDef methods[] = {
    {"permute", permute, METH_VARARGS, "permute(indices, out, n, mask, s1, s2, keys): Permutation.__call__ in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_permute", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__permute(void) { return PyModule_Create(&module); }
