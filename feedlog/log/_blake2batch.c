/* feedlog.log._blake2batch (optional, compiled at install by setup.py): the feed's hot loops in C.
 * - BLAKE2b-256 and the Merkle tree's leaves and parents a batch at a time (`leaf_hashes`,
 *   `parent_hashes`), and the whole fold of a batch into the tree (`fold`: merkle.fold);
 * - `Core.get`'s read of a block from the maps of the index, tree and log (`mapped_block`);
 * - a replica's scan for writer timestamps (`writer_shape`: entry_scan's first tier).
 * - retention's filter of blocks that may carry an expiry (`expiry_shape`: entry_scan.expiry_candidates).
 * Each has a Python reference (merkle, core, entry_scan) that runs where this module was not built,
 * and tests/log/test_blake2batch.py and test_entry_scan.py compare the two on random input.
 *
 * The tree's hashes are BLAKE2b-256 (RFC 7693, no key) of a leaf's
 * 0x00 || u64le(size) || block and of a parent's 0x01 || u64le(size) || left || right.
 * hashlib computes each in ~120 ns, but reaching it from Python costs ~350 ns more per hash
 * (a hasher copied, updated, digested, each an object); here a whole batch is one call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 128
#define OUT 32

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

typedef struct {
    uint64_t h[8];
    uint64_t t0, t1; /* bytes hashed so far (a 128-bit counter) */
    uint8_t buf[BLOCK];
    size_t buflen; /* 0..BLOCK: the last block is kept until the end, to be compressed as the last */
} state;

static inline uint64_t rotr(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24) |
           ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static inline void store64(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}

#define G(a, b, c, d, x, y)        \
    do {                           \
        a = a + b + (x);           \
        d = rotr(d ^ a, 32);       \
        c = c + d;                 \
        b = rotr(b ^ c, 24);       \
        a = a + b + (y);           \
        d = rotr(d ^ a, 16);       \
        c = c + d;                 \
        b = rotr(b ^ c, 63);       \
    } while (0)

#define ROUND(r)                                                        \
    do {                                                                \
        G(v[0], v[4], v[8], v[12], m[SIGMA[r][0]], m[SIGMA[r][1]]);     \
        G(v[1], v[5], v[9], v[13], m[SIGMA[r][2]], m[SIGMA[r][3]]);     \
        G(v[2], v[6], v[10], v[14], m[SIGMA[r][4]], m[SIGMA[r][5]]);    \
        G(v[3], v[7], v[11], v[15], m[SIGMA[r][6]], m[SIGMA[r][7]]);    \
        G(v[0], v[5], v[10], v[15], m[SIGMA[r][8]], m[SIGMA[r][9]]);    \
        G(v[1], v[6], v[11], v[12], m[SIGMA[r][10]], m[SIGMA[r][11]]);  \
        G(v[2], v[7], v[8], v[13], m[SIGMA[r][12]], m[SIGMA[r][13]]);   \
        G(v[3], v[4], v[9], v[14], m[SIGMA[r][14]], m[SIGMA[r][15]]);   \
    } while (0)

static void compress(state *s, const uint8_t *block, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= s->t0;
    v[13] ^= s->t1;
    if (last) v[14] = ~v[14];
    /* rounds spelled out: with constant schedule indices the message words stay in registers */
    ROUND(0); ROUND(1); ROUND(2); ROUND(3); ROUND(4); ROUND(5);
    ROUND(6); ROUND(7); ROUND(8); ROUND(9); ROUND(10); ROUND(11);
    for (int i = 0; i < 8; i++) s->h[i] ^= v[i] ^ v[i + 8];
}

static void count(state *s, uint64_t n) {
    s->t0 += n;
    if (s->t0 < n) s->t1++;
}

static void init(state *s) {
    memcpy(s->h, IV, sizeof IV);
    s->h[0] ^= 0x01010000ULL ^ OUT; /* digest length 32, no key, fanout and depth 1 */
    s->t0 = s->t1 = 0;
    s->buflen = 0;
}

static void update(state *s, const uint8_t *in, size_t n) {
    if (!n) return;
    size_t fill = BLOCK - s->buflen;
    if (n > fill) { /* the buffer fills and more follows: it is not the last block */
        memcpy(s->buf + s->buflen, in, fill);
        count(s, BLOCK);
        compress(s, s->buf, 0);
        s->buflen = 0;
        in += fill;
        n -= fill;
        while (n > BLOCK) {
            count(s, BLOCK);
            compress(s, in, 0);
            in += BLOCK;
            n -= BLOCK;
        }
    }
    memcpy(s->buf + s->buflen, in, n);
    s->buflen += n;
}

static void final(state *s, uint8_t *out) {
    count(s, s->buflen);
    memset(s->buf + s->buflen, 0, BLOCK - s->buflen);
    compress(s, s->buf, 1);
    for (int i = 0; i < OUT / 8; i++) store64(out + 8 * i, s->h[i]);
}

/* BLAKE2b-256 of head[0..nh) || data[0..nd) into out: a message that fits one block (a tree node of a
 * block of up to 119 bytes, any parent) is laid out once and compressed once */
static void hash2(const uint8_t *head, size_t nh, const uint8_t *data, size_t nd, uint8_t *out) {
    state s;
    init(&s);
    if (nh + nd <= BLOCK) {
        memcpy(s.buf, head, nh);
        if (nd) memcpy(s.buf + nh, data, nd);
        s.buflen = nh + nd;
    } else {
        update(&s, head, nh);
        update(&s, data, nd);
    }
    final(&s, out);
}

/* blake2b_256(data) -> bytes: the plain hash, for tests against hashlib */
static PyObject *py_blake2b_256(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, OUT);
    if (out != NULL) {
        state s;
        init(&s);
        update(&s, (const uint8_t *)b.buf, (size_t)b.len);
        final(&s, (uint8_t *)PyBytes_AS_STRING(out));
    }
    PyBuffer_Release(&b);
    return out;
}

/* mapped_block(index, tree, log, seq) -> bytes | int: Core.get's read from its maps of the index (u64 words:
 * offset, then u32 length | u32 flags << 32), the tree (40-byte nodes, block seq's leaf at 2 * seq) and the log.
 * The block's bytes once they hash to their leaf; MAPPED_CLEARED if compaction cleared it; MAPPED_OUTSIDE
 * if the maps do not hold it (the caller remaps or preads); MAPPED_CORRUPT if it fails its hash check. */
#define MAPPED_CLEARED 0
#define MAPPED_OUTSIDE 1
#define MAPPED_CORRUPT 2
#define FLAG_CLEARED 1 /* storage.CLEARED */
#define NODE 40
static PyObject *py_mapped_block(PyObject *self, PyObject *args) {
    PyObject *ix_o, *tm_o, *lm_o;
    Py_ssize_t seq;
    if (!PyArg_ParseTuple(args, "OOOn", &ix_o, &tm_o, &lm_o, &seq)) return NULL;
    Py_buffer ix, tm, lm;
    if (PyObject_GetBuffer(ix_o, &ix, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(tm_o, &tm, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ix);
        return NULL;
    }
    if (PyObject_GetBuffer(lm_o, &lm, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ix);
        PyBuffer_Release(&tm);
        return NULL;
    }
    PyObject *out = NULL;
    long code = MAPPED_OUTSIDE;
    if (seq < 0 || seq > (PY_SSIZE_T_MAX - NODE) / (2 * NODE)) goto answer; /* 2*NODE*seq + NODE fits */
    if (16 * seq + 16 > ix.len || 2 * NODE * seq + NODE > tm.len) goto answer;
    const uint8_t *entry = (const uint8_t *)ix.buf + 16 * seq;
    uint64_t off = load64(entry), word = load64(entry + 8);
    if ((word >> 32) & FLAG_CLEARED) {
        code = MAPPED_CLEARED;
        goto answer;
    }
    uint64_t n = word & 0xFFFFFFFFULL;
    if (off > (uint64_t)lm.len || n > (uint64_t)lm.len - off) goto answer;
    const uint8_t *block = (const uint8_t *)lm.buf + off;
    uint8_t prefix[9], digest[OUT];
    prefix[0] = 0; /* LEAF_TYPE */
    store64(prefix + 1, n);
    if (n > 4096) { /* as hashlib does for large data: other threads go on meanwhile (the maps are held) */
        Py_BEGIN_ALLOW_THREADS
        hash2(prefix, sizeof prefix, block, (size_t)n, digest);
        Py_END_ALLOW_THREADS
    } else {
        hash2(prefix, sizeof prefix, block, (size_t)n, digest);
    }
    if (memcmp(digest, (const uint8_t *)tm.buf + 2 * NODE * seq, OUT) != 0) {
        code = MAPPED_CORRUPT;
        goto answer;
    }
    out = PyBytes_FromStringAndSize((const char *)block, (Py_ssize_t)n);
    goto done;
answer:
    out = PyLong_FromLong(code);
done:
    PyBuffer_Release(&ix);
    PyBuffer_Release(&tm);
    PyBuffer_Release(&lm);
    return out;
}

/* The items of a sequence without copying a list (PySequence_Fast). Python code may run during a loop
 * (a size's __index__, a buffer's exporter) and change the list: every item is taken through `item`,
 * which checks the index against the list's length at that moment. */
static PyObject *frozen(PyObject *seq) { return PySequence_Fast(seq, "expected a sequence"); }

/* the two sequence arguments of leaf_hashes and parent_hashes, each `frozen`; -1 (nothing held) on error */
static int frozen_pair(PyObject *args, PyObject **first, PyObject **second) {
    PyObject *first_in, *second_in;
    if (!PyArg_ParseTuple(args, "OO", &first_in, &second_in)) return -1;
    if ((*first = frozen(first_in)) == NULL) return -1;
    if ((*second = frozen(second_in)) == NULL) {
        Py_CLEAR(*first);
        return -1;
    }
    return 0;
}

static PyObject *item(PyObject *seq, Py_ssize_t i) {
    if (i >= PySequence_Fast_GET_SIZE(seq)) {
        PyErr_SetString(PyExc_RuntimeError, "a sequence changed size while it was hashed");
        return NULL;
    }
    return PySequence_Fast_GET_ITEM(seq, i); /* borrowed: used before any more Python code runs */
}

/* an int or a numpy integer as an unsigned 64-bit value; OverflowError past it, never wrapped */
static int u64_of(PyObject *o, uint64_t *v) {
    PyObject *index = PyNumber_Index(o);
    if (index == NULL) return -1;
    unsigned long long x = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *v = (uint64_t)x;
    return 0;
}

static int size_at(PyObject *sizes, Py_ssize_t i, uint64_t *size) {
    PyObject *given = item(sizes, i);
    return given == NULL ? -1 : u64_of(given, size);
}

/* The leaf hashes of blocks[0..n) (sizes[i] in each prefix) into digests (n * OUT bytes), and the sizes
 * into lens: CHUNK blocks at a time, their buffers held while they are hashed without the GIL (a
 * reader's other threads go on meanwhile). 0, or -1 with the exception set and every buffer released. */
#define CHUNK 256
static int hash_leaves(PyObject *blocks, PyObject *sizes, Py_ssize_t n, uint8_t *digests, uint64_t *lens) {
    Py_buffer *bufs = PyMem_New(Py_buffer, CHUNK);
    if (bufs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t held = 0;
    for (Py_ssize_t at = 0; at < n; at += CHUNK) {
        Py_ssize_t m = n - at < CHUNK ? n - at : CHUNK;
        for (held = 0; held < m; held++) {
            if (size_at(sizes, at + held, &lens[at + held]) < 0) goto fail;
            PyObject *block = item(blocks, at + held);
            if (block == NULL || PyObject_GetBuffer(block, &bufs[held], PyBUF_SIMPLE) < 0) goto fail;
        }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < m; i++) {
            uint8_t prefix[9];
            prefix[0] = 0; /* LEAF_TYPE */
            store64(prefix + 1, lens[at + i]);
            hash2(prefix, sizeof prefix, (const uint8_t *)bufs[i].buf, (size_t)bufs[i].len,
                  digests + (size_t)(at + i) * OUT);
        }
        Py_END_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < m; i++) PyBuffer_Release(&bufs[i]);
    }
    PyMem_Free(bufs);
    return 0;
fail:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    return -1;
}

/* digests[0..n) as a list of 32-byte bytes objects */
static PyObject *digest_list(const uint8_t *digests, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *digest = PyBytes_FromStringAndSize((const char *)digests + (size_t)i * OUT, OUT);
        if (digest == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, digest);
    }
    return out;
}

/* leaf_hashes(blocks, sizes) -> list[bytes]: BLAKE2b-256(0x00 || u64le(sizes[i]) || blocks[i]) for each i */
static PyObject *py_leaf_hashes(PyObject *self, PyObject *args) {
    PyObject *blocks, *sizes;
    if (frozen_pair(args, &blocks, &sizes) < 0) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks);
    PyObject *out = NULL;
    uint8_t *digests = PyMem_Malloc((size_t)(n ? n : 1) * OUT);
    uint64_t *lens = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (digests == NULL || lens == NULL)
        PyErr_NoMemory();
    else if (PySequence_Fast_GET_SIZE(sizes) != n)
        PyErr_SetString(PyExc_ValueError, "blocks and sizes differ in length");
    else if (hash_leaves(blocks, sizes, n, digests, lens) == 0)
        out = digest_list(digests, n);
    PyMem_Free(digests);
    PyMem_Free(lens);
    Py_DECREF(blocks);
    Py_DECREF(sizes);
    return out;
}

/* parent_hashes(hashes, sizes) -> list[bytes]: for each i < len(sizes),
 * BLAKE2b-256(0x01 || u64le(sizes[i]) || hashes[2i] || hashes[2i+1]); every hash is 32 bytes.
 * The inputs are copied out first and hashed without the GIL. */
static PyObject *py_parent_hashes(PyObject *self, PyObject *args) {
    PyObject *hashes, *sizes;
    if (frozen_pair(args, &hashes, &sizes) < 0) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sizes);
    PyObject *out = NULL;
    enum { MSG = 1 + 8 + 2 * OUT };
    uint8_t *msgs = NULL, *digests = NULL;
    if (PySequence_Fast_GET_SIZE(hashes) < 2 * n) {
        PyErr_SetString(PyExc_ValueError, "fewer than two hashes per parent");
        goto done;
    }
    msgs = PyMem_Malloc((size_t)(n ? n : 1) * MSG);
    digests = PyMem_Malloc((size_t)(n ? n : 1) * OUT);
    if (msgs == NULL || digests == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t *msg = msgs + (size_t)i * MSG;
        uint64_t size;
        if (size_at(sizes, i, &size) < 0) goto done;
        msg[0] = 1; /* PARENT_TYPE */
        store64(msg + 1, size);
        for (int k = 0; k < 2; k++) {
            PyObject *h = item(hashes, 2 * i + k);
            if (h == NULL) goto done;
            if (!PyBytes_Check(h) || PyBytes_GET_SIZE(h) != OUT) {
                PyErr_Format(PyExc_ValueError, "hash %zd is not 32 bytes", 2 * i + k);
                goto done;
            }
            memcpy(msg + 9 + k * OUT, PyBytes_AS_STRING(h), OUT);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        hash2(msgs + (size_t)i * MSG, MSG, NULL, 0, digests + (size_t)i * OUT);
    }
    Py_END_ALLOW_THREADS
    out = digest_list(digests, n);
done:
    PyMem_Free(msgs);
    PyMem_Free(digests);
    Py_DECREF(hashes);
    Py_DECREF(sizes);
    return out;
}

/* ---- a batch folded into the tree: merkle.fold ---------------------------------------------------------- */

static PyObject *node_tuple(uint64_t index, const uint8_t *hash, uint64_t size) {
    return Py_BuildValue("(Ky#K)", (unsigned long long)index, (const char *)hash, (Py_ssize_t)OUT,
                         (unsigned long long)size);
}

static int depth_of(uint64_t index) { /* trailing one bits (flat_tree.depth) */
    int d = 0;
    while (index & 1) {
        index >>= 1;
        d++;
    }
    return d;
}

/* fold(roots, start, blocks, sizes) -> (buf, outside, roots): merkle.fold's work with no Python object per
 * node. `roots`: the tree's roots at `start`, (index, hash, size) each; `sizes`: the blocks' lengths. `buf`
 * holds the nodes of flat-tree indices 2*start .. 2*(start+n)-2 (40 bytes each: hash, u64le size; zero where
 * the batch computes none), `outside` the parents joining the batch to older roots, `roots` the new roots,
 * both as (index, hash, size) tuples, roots by index. The leaves are hashed as leaf_hashes does
 * (hash_leaves), the levels above them without the GIL. */
static PyObject *py_fold(PyObject *self, PyObject *args) {
    PyObject *roots_in, *start_in, *blocks_in, *sizes_in;
    if (!PyArg_ParseTuple(args, "OOOO", &roots_in, &start_in, &blocks_in, &sizes_in)) return NULL;
    uint64_t start;
    if (u64_of(start_in, &start) < 0) return NULL; /* an int or a numpy integer; never wrapped */
    PyObject *roots = NULL, *blocks = NULL, *sizes = NULL, *buf = NULL, *outside = NULL, *out_roots = NULL,
             *result = NULL;
    uint8_t *hs = NULL, *next_h = NULL;
    uint64_t *ss = NULL, *next_s = NULL;
    /* old roots by depth (a full tree's roots have distinct depths) */
    int have_root[64] = {0};
    uint64_t root_index[64], root_size[64];
    uint8_t root_hash[64][OUT];
    /* the new tree's roots: at most one made per level, and the old ones left (128 bounds even roots
     * that do not belong to a tree at `start`, which merkle.fold would also take) */
    int n_new = 0;
    uint64_t new_index[128], new_size[128];
    uint8_t new_hash[128][OUT];

    if ((roots = frozen(roots_in)) == NULL || (blocks = frozen(blocks_in)) == NULL ||
        (sizes = frozen(sizes_in)) == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks);
    if (PySequence_Fast_GET_SIZE(sizes) != n) {
        PyErr_SetString(PyExc_ValueError, "blocks and sizes differ in length");
        goto done;
    }
    if (start > ((uint64_t)1 << 62) || (uint64_t)n > ((uint64_t)1 << 62) - start) {
        PyErr_SetString(PyExc_OverflowError, "a batch past 2**62 blocks"); /* flat indices stay under 2**63 */
        goto done;
    }
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(roots); r++) {
        PyObject *node = item(roots, r);
        if (node == NULL) goto done;
        /* a tuple of its own (a Node is one already): a root given as a list that its size's __index__
         * empties cannot pull its hash from under us */
        PyObject *fields = PySequence_Tuple(node);
        if (fields == NULL) goto done;
        uint64_t index, size;
        int bad = PySequence_Fast_GET_SIZE(fields) != 3;
        PyObject *h = bad ? NULL : PySequence_Fast_GET_ITEM(fields, 1);
        if (!bad) bad = !PyBytes_Check(h) || PyBytes_GET_SIZE(h) != OUT;
        if (bad) {
            Py_DECREF(fields);
            PyErr_SetString(PyExc_ValueError, "a root is (index, hash of 32 bytes, size)");
            goto done;
        }
        if (u64_of(PySequence_Fast_GET_ITEM(fields, 0), &index) < 0 ||
            u64_of(PySequence_Fast_GET_ITEM(fields, 2), &size) < 0) {
            Py_DECREF(fields);
            goto done;
        }
        int d = depth_of(index);
        if (d >= 63) {
            Py_DECREF(fields);
            PyErr_SetString(PyExc_ValueError, "a root deeper than any tree");
            goto done;
        }
        have_root[d] = 1;  /* a later root of the same depth replaces it, as merkle.fold's dict does */
        root_index[d] = index;
        root_size[d] = size;
        memcpy(root_hash[d], PyBytes_AS_STRING(h), OUT);
        Py_DECREF(fields);
    }
    Py_ssize_t width = n ? 2 * n - 1 : 0;
    uint64_t lo = 2 * start;
    buf = PyBytes_FromStringAndSize(NULL, width * NODE);
    hs = PyMem_Malloc((size_t)(n + 1) * OUT);
    ss = PyMem_Malloc((size_t)(n + 1) * sizeof(uint64_t));
    next_h = PyMem_Malloc((size_t)(n / 2 + 1) * OUT);
    next_s = PyMem_Malloc((size_t)(n / 2 + 1) * sizeof(uint64_t));
    if (buf == NULL || hs == NULL || ss == NULL || next_h == NULL || next_s == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(buf);
    memset(out, 0, (size_t)width * NODE);
    /* the leaves, one slot in: a level starting at an odd offset takes an old root in front */
    uint8_t *h0 = hs + OUT;
    uint64_t *s0 = ss + 1;
    if (hash_leaves(blocks, sizes, n, h0, s0) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) { /* leaf i is node 2i of the range */
        memcpy(out + (size_t)2 * i * NODE, h0 + (size_t)i * OUT, OUT);
        store64(out + (size_t)2 * i * NODE + OUT, s0[i]);
    }
    /* the levels above, as merkle.fold: d the depth, a the offset (among nodes of depth d) of cur[0] */
    outside = PyList_New(0);
    if (outside == NULL) goto done;
    uint8_t *cur_h = h0;
    uint64_t *cur_s = s0;
    Py_ssize_t m = n;
    uint64_t a = start;
    int d = 0, missing = 0, overflow = 0;
    /* (index, hash, size) of parents joining older roots: at most one per level */
    int n_out = 0;
    uint64_t out_index[64], out_size[64];
    uint8_t out_hash[64][OUT];
    Py_BEGIN_ALLOW_THREADS
    while (m > 0) {
        if (a & 1) { /* the left sibling of the level's first node is an old root */
            if (d >= 64 || !have_root[d]) {
                missing = 1;
                break;
            }
            have_root[d] = 0;
            cur_h -= OUT;
            cur_s -= 1;
            memcpy(cur_h, root_hash[d], OUT);
            cur_s[0] = root_size[d];
            m += 1;
            a -= 1;
        }
        if (m & 1) {
            new_index[n_new] = (a + (uint64_t)m - 1) << (d + 1);
            new_index[n_new] += ((uint64_t)1 << d) - 1;
            memcpy(new_hash[n_new], cur_h + (size_t)(m - 1) * OUT, OUT);
            new_size[n_new] = cur_s[m - 1];
            n_new++;
        }
        if (m < 2) break;
        Py_ssize_t p = m / 2;
        uint8_t msg[1 + 8 + 2 * OUT];
        msg[0] = 1; /* PARENT_TYPE */
        for (Py_ssize_t j = 0; j < p; j++) {
            uint64_t size = cur_s[2 * j] + cur_s[2 * j + 1];
            if (size < cur_s[2 * j]) overflow = 1;
            store64(msg + 1, size);
            memcpy(msg + 9, cur_h + (size_t)2 * j * OUT, 2 * OUT);
            hash2(msg, sizeof msg, NULL, 0, next_h + (size_t)j * OUT);
            next_s[j] = size;
        }
        d += 1;
        a >>= 1;
        uint64_t step = (uint64_t)1 << (d + 1), i = (a << (d + 1)) + ((uint64_t)1 << d) - 1;
        Py_ssize_t k = 0;
        if (i < lo) { /* only a level's first parent can join an old root (indices below the batch) */
            out_index[n_out] = i;
            memcpy(out_hash[n_out], next_h, OUT);
            out_size[n_out] = next_s[0];
            n_out++;
            k = 1;
            i += step;
        }
        for (Py_ssize_t j = k; j < p; j++, i += step) {
            uint8_t *node = out + (size_t)(i - lo) * NODE;
            memcpy(node, next_h + (size_t)j * OUT, OUT);
            store64(node + OUT, next_s[j]);
        }
        /* the parents become the next level, one slot in (the leaves' arrays are free for them) */
        cur_h = hs + OUT;
        cur_s = ss + 1;
        memcpy(cur_h, next_h, (size_t)p * OUT);
        memcpy(cur_s, next_s, (size_t)p * sizeof(uint64_t));
        m = p;
    }
    Py_END_ALLOW_THREADS
    if (missing) {
        PyObject *key = PyLong_FromLong(d); /* as merkle.fold's kept.pop(d): the roots are not those at start */
        if (key != NULL) {
            PyErr_SetObject(PyExc_KeyError, key);
            Py_DECREF(key);
        }
        goto done;
    }
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "a node's size exceeds 2**64 - 1");
        goto done;
    }
    for (int j = 0; j < n_out; j++) {
        PyObject *t = node_tuple(out_index[j], out_hash[j], out_size[j]);
        if (t == NULL || PyList_Append(outside, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    /* the new roots: the old ones no new node joined, and those made here; by index */
    out_roots = PyList_New(0);
    if (out_roots == NULL) goto done;
    for (int dd = 0; dd < 64; dd++) {
        if (have_root[dd]) {
            new_index[n_new] = root_index[dd];
            memcpy(new_hash[n_new], root_hash[dd], OUT);
            new_size[n_new] = root_size[dd];
            n_new++;
        }
    }
    for (int x = 1; x < n_new; x++) /* insertion sort: a few dozen at most */
        for (int y = x; y > 0 && new_index[y - 1] > new_index[y]; y--) {
            uint64_t ti = new_index[y], ts = new_size[y];
            uint8_t th[OUT];
            memcpy(th, new_hash[y], OUT);
            new_index[y] = new_index[y - 1];
            new_size[y] = new_size[y - 1];
            memcpy(new_hash[y], new_hash[y - 1], OUT);
            new_index[y - 1] = ti;
            new_size[y - 1] = ts;
            memcpy(new_hash[y - 1], th, OUT);
        }
    for (int j = 0; j < n_new; j++) {
        PyObject *t = node_tuple(new_index[j], new_hash[j], new_size[j]);
        if (t == NULL || PyList_Append(out_roots, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    result = PyTuple_Pack(3, buf, outside, out_roots);
done:
    PyMem_Free(hs);
    PyMem_Free(ss);
    PyMem_Free(next_h);
    PyMem_Free(next_s);
    Py_XDECREF(roots);
    Py_XDECREF(blocks);
    Py_XDECREF(sizes);
    Py_XDECREF(buf);
    Py_XDECREF(outside);
    Py_XDECREF(out_roots);
    return result;
}

/* ---- writer timestamps: entry_scan._writer_shape, a block at a time -------------------------------- */

/* The varint at buf[p..e): its value, and the position after it; -1 if it runs past e or is longer than
 * 9 bytes (entry_columns.MAX_VARINT: such a block is left to the other tiers, as the numpy scan does). */
static Py_ssize_t read_varint(const uint8_t *buf, Py_ssize_t p, Py_ssize_t e, uint64_t *val) {
    uint64_t v = 0;
    for (int k = 0; k < 9; k++) {
        if (p + k >= e) return -1;
        uint8_t b = buf[p + k];
        v |= (uint64_t)(b & 0x7F) << (7 * k);
        if (!(b & 0x80)) {
            *val = v;
            return p + k + 1;
        }
    }
    return -1;
}

static const struct {
    uint8_t tag, delimited, required;
} WRITER_FIELDS[] = {
    {0x0A, 1, 1}, /* key */
    {0x12, 1, 0}, /* value */
    {0x18, 0, 0}, /* deleted */
    {0x22, 1, 1}, /* trie */
    {0x48, 0, 0}, /* timestamp */
    {0x50, 0, 0}, /* expires_at */
};

/* Whether block[0..e) is an InflatedEntry laid out as encode_entry writes it (entry_scan._writer_shape
 * says which layout, and why every such block is a valid entry), and its timestamp if it has one. */
static int writer_shape_one(const uint8_t *buf, Py_ssize_t e, int *has, uint64_t *ts, int *expires) {
    Py_ssize_t p = 0, key_at = 0;
    uint64_t key_len = 0;
    *has = 0;
    *ts = 0;
    *expires = 0;
    for (size_t f = 0; f < sizeof WRITER_FIELDS / sizeof WRITER_FIELDS[0]; f++) {
        if (!(p < e && buf[p] == WRITER_FIELDS[f].tag)) {
            if (WRITER_FIELDS[f].required) return 0;
            continue;
        }
        uint64_t val;
        Py_ssize_t after = read_varint(buf, p + 1, e, &val);
        if (after < 0) return 0;
        if (WRITER_FIELDS[f].delimited) {
            if (val > (uint64_t)(e - after)) return 0;
            if (WRITER_FIELDS[f].tag == 0x0A) {
                key_at = after;
                key_len = val;
            }
            after += (Py_ssize_t)val;
        }
        if (WRITER_FIELDS[f].tag == 0x48) {
            *has = 1;
            *ts = val;
        }
        if (WRITER_FIELDS[f].tag == 0x50) *expires = 1;
        p = after;
    }
    if (p != e) return 0;
    for (uint64_t i = 0; i < key_len; i++) /* a key byte over 0x7F may be no UTF-8: the other tiers decide */
        if (buf[key_at + (Py_ssize_t)i] & 0x80) return 0;
    return 1;
}

/* writer_shape(blocks) -> (ok, has_timestamp, timestamps): entry_scan._writer_shape of each block, as
 * bytes (one 0/1 byte per block for the first two; a little-endian uint64 per block, 0 where none) */
static PyObject *py_writer_shape(PyObject *self, PyObject *arg) {
    PyObject *blocks = frozen(arg);
    if (blocks == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks);
    PyObject *ok = PyBytes_FromStringAndSize(NULL, n), *has = PyBytes_FromStringAndSize(NULL, n);
    PyObject *ts = PyBytes_FromStringAndSize(NULL, 8 * n), *out = NULL;
    if (ok == NULL || has == NULL || ts == NULL) goto done;
    uint8_t *okp = (uint8_t *)PyBytes_AS_STRING(ok), *hasp = (uint8_t *)PyBytes_AS_STRING(has);
    uint8_t *tsp = (uint8_t *)PyBytes_AS_STRING(ts);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = item(blocks, i);
        if (it == NULL) goto done;
        int h, good, x;
        uint64_t t;
        if (PyBytes_Check(it)) {
            good = writer_shape_one((const uint8_t *)PyBytes_AS_STRING(it), PyBytes_GET_SIZE(it), &h, &t, &x);
        } else {
            Py_buffer b;
            if (PyObject_GetBuffer(it, &b, PyBUF_SIMPLE) < 0) goto done;
            good = writer_shape_one((const uint8_t *)b.buf, b.len, &h, &t, &x);
            PyBuffer_Release(&b);
        }
        okp[i] = (uint8_t)good;
        hasp[i] = (uint8_t)(good && h);
        store64(tsp + 8 * i, good && h ? t : 0);
    }
    out = PyTuple_Pack(3, ok, has, ts);
done:
    Py_XDECREF(ok);
    Py_XDECREF(has);
    Py_XDECREF(ts);
    Py_DECREF(blocks);
    return out;
}

/* expiry_shape(blocks) -> bytes: per block 1 if it may carry an expires_at (entry_scan.expiry_candidates: it
 * has one, or it is not laid out as encode_entry writes it, so only a full parse can tell), else 0 */
static PyObject *py_expiry_shape(PyObject *self, PyObject *arg) {
    PyObject *blocks = frozen(arg);
    if (blocks == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL) goto done;
    uint8_t *op = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = item(blocks, i);
        if (it == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        int h, good, x;
        uint64_t t;
        if (PyBytes_Check(it)) {
            good = writer_shape_one((const uint8_t *)PyBytes_AS_STRING(it), PyBytes_GET_SIZE(it), &h, &t, &x);
        } else {
            Py_buffer b;
            if (PyObject_GetBuffer(it, &b, PyBUF_SIMPLE) < 0) {
                Py_CLEAR(out);
                goto done;
            }
            good = writer_shape_one((const uint8_t *)b.buf, b.len, &h, &t, &x);
            PyBuffer_Release(&b);
        }
        op[i] = (uint8_t)(!good || x);
    }
done:
    Py_DECREF(blocks);
    return out;
}

static PyMethodDef methods[] = {
    {"blake2b_256", py_blake2b_256, METH_O, "BLAKE2b with a 32-byte digest, no key."},
    {"fold", py_fold, METH_VARARGS, "merkle.fold's nodes: (buf, outside, roots), nodes as (index, hash, size)."},
    {"mapped_block", py_mapped_block, METH_VARARGS,
     "Core.get's read from its maps: the block's bytes, or 0 (cleared), 1 (not in the maps), 2 (corrupt)."},
    {"leaf_hashes", py_leaf_hashes, METH_VARARGS, "BLAKE2b-256(0x00 || u64le(size) || block) of each block."},
    {"parent_hashes", py_parent_hashes, METH_VARARGS,
     "BLAKE2b-256(0x01 || u64le(sizes[i]) || hashes[2i] || hashes[2i+1]) for each i < len(sizes)."},
    {"writer_shape", py_writer_shape, METH_O,
     "entry_scan._writer_shape of each block: (ok, has_timestamp, timestamps) as bytes."},
    {"expiry_shape", py_expiry_shape, METH_O,
     "entry_scan.expiry_candidates of each block: 1 if it may carry an expires_at, as bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_blake2batch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__blake2batch(void) { return PyModule_Create(&module); }
