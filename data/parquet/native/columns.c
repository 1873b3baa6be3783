/* One pass per Parquet column, from the Arrow buffers to the batch's arrays: the ids of a
 * sparse column (hashed or taken modulo the table size, with their bag lengths) and the
 * values of a dense column (nulls as 0, transformed, into a float32 matrix column).
 * data/parquet/kernel.py calls these through ctypes, which releases the GIL for the call,
 * so that reader threads convert in parallel; data/parquet/columns.py keeps the numpy
 * reference they are tested against (tests/data/test_parquet_kernel.py). Nothing here
 * allocates, and nothing here raises: a bad value is returned as its index, and Python
 * builds the one line naming file, row group, row and column. */
#include <math.h>
#include <stdint.h>

#include "id_hash.h"

/* data/parquet/kernel.py VERSION: raised whenever a signature or a structure changes, so
 * that a library built from older sources is refused rather than misread. */
#define DLRM_COLUMNS_VERSION 5

int32_t dlrm_columns_version(void) { return DLRM_COLUMNS_VERSION; }

/* The value kinds of an Arrow array (data/parquet/kernel.py KINDS). */
enum {
    KIND_INT8, KIND_INT16, KIND_INT32, KIND_INT64,
    KIND_UINT8, KIND_UINT16, KIND_UINT32, KIND_UINT64,
    KIND_FLOAT32, KIND_FLOAT64,
    KIND_STRING32, /* string or binary: int32 offsets */
    KIND_STRING64  /* large_string or large_binary: int64 offsets */
};

/* A dictionary entry's key and embedding row, computed once for the dictionary (one
 * cache line holds both: the entries of a large dictionary are read at random). */
typedef struct {
    uint64_t key;
    int64_t row;
} dlrm_entry;

/* A chunk of a sparse column: rows of single ids or of lists of ids. Indices are Arrow's:
 * row r of the list level is list_offset + r, and the list offsets index the values
 * array, whose element i is at offset + i of its buffers. */
typedef struct {
    int64_t length;               /* rows */
    const uint8_t *list_validity; /* NULL: no null list */
    const void *list_offsets;     /* NULL: not a list column */
    int64_t list_offset;
    int32_t list_offsets_64;      /* large_list */
    int32_t kind;                 /* of the values */
    const uint8_t *validity;      /* of the values; NULL: no null value */
    int64_t offset;
    const void *value_offsets;    /* strings */
    const uint8_t *data;
    const dlrm_entry *entries;    /* dictionary-encoded (data: the indices): by index, NULL: not */
    uint8_t *marks;               /* dictionary-encoded: a zeroed bit per entry */
    uint64_t *distinct;           /* out (dictionary-encoded): the keys of the entries read, each once */
    int64_t distinct_written;     /* out: how many */
    uint64_t table_size;          /* of the chunk's feature */
    int64_t lengths_at;           /* where its rows' bag sizes go in lengths */
    int64_t written;              /* out: the ids written */
    int64_t first_negative;       /* out: the first negative id (modulo), among those, or -1 */
} dlrm_ids;

static inline int valid(const uint8_t *bitmap, int64_t i) {
    return bitmap == 0 || ((bitmap[i >> 3] >> (i & 7)) & 1);
}

/* The key of value i of a chunk whose kind is a constant where this is inlined. */
static inline __attribute__((always_inline)) uint64_t key_at(const dlrm_ids *c, int32_t kind, int64_t i) {
    int64_t index;
    switch (kind) {
    case KIND_INT8: index = ((const int8_t *)c->data)[i]; break;
    case KIND_INT16: index = ((const int16_t *)c->data)[i]; break;
    case KIND_INT32: index = ((const int32_t *)c->data)[i]; break;
    case KIND_INT64: index = ((const int64_t *)c->data)[i]; break;
    case KIND_UINT8: index = ((const uint8_t *)c->data)[i]; break;
    case KIND_UINT16: index = ((const uint16_t *)c->data)[i]; break;
    case KIND_UINT32: index = ((const uint32_t *)c->data)[i]; break;
    case KIND_UINT64: index = (int64_t)((const uint64_t *)c->data)[i]; break;
    case KIND_STRING32: {
        const int32_t *o = (const int32_t *)c->value_offsets;
        return dlrm_string_key(c->data + o[i], (size_t)(o[i + 1] - o[i]));
    }
    default: {
        const int64_t *o = (const int64_t *)c->value_offsets;
        return dlrm_string_key(c->data + o[i], (size_t)(o[i + 1] - o[i]));
    }
    }
    return dlrm_integer_key(index);
}

/* The dictionary index of value i of a dictionary-encoded chunk (its indices: an integer kind). */
static inline __attribute__((always_inline)) int64_t index_at(const dlrm_ids *c, int32_t kind, int64_t i) {
    switch (kind) {
    case KIND_INT8: return ((const int8_t *)c->data)[i];
    case KIND_INT16: return ((const int16_t *)c->data)[i];
    case KIND_INT32: return ((const int32_t *)c->data)[i];
    case KIND_INT64: return ((const int64_t *)c->data)[i];
    case KIND_UINT8: return ((const uint8_t *)c->data)[i];
    case KIND_UINT16: return ((const uint16_t *)c->data)[i];
    case KIND_UINT32: return ((const uint32_t *)c->data)[i];
    default: return (int64_t)((const uint64_t *)c->data)[i];
    }
}

/* One chunk's bags at lengths[0..length), keys[0..), rows[0..); sets written and
 * first_negative. Inlined once per kind (a constant), so that the loop holds no switch;
 * the chunk is read into a local copy, which the stores through the outputs cannot alias. */
static inline __attribute__((always_inline)) void id_bags_of(dlrm_ids *chunk, const int32_t kind, int32_t modulo,
                                                             uint64_t salt, int32_t *restrict lengths,
                                                             uint64_t *restrict keys, int64_t *restrict rows) {
    const dlrm_ids c = *chunk;
    int64_t out = 0, first_negative = -1;
    for (int64_t r = 0; r < c.length; ++r) {
        int64_t begin = r, end = r + 1;
        if (c.list_offsets) {
            int64_t l = c.list_offset + r;
            if (!valid(c.list_validity, l)) {
                lengths[r] = 0;
                continue;
            }
            if (c.list_offsets_64) {
                begin = ((const int64_t *)c.list_offsets)[l];
                end = ((const int64_t *)c.list_offsets)[l + 1];
            } else {
                begin = ((const int32_t *)c.list_offsets)[l];
                end = ((const int32_t *)c.list_offsets)[l + 1];
            }
        }
        int64_t first = out;
        for (int64_t i = c.offset + begin; i < c.offset + end; ++i) {
            if (!valid(c.validity, i))
                continue;
            uint64_t key = key_at(&c, kind, i);
            if (modulo) {
                int64_t id = (int64_t)key;
                if (id < 0 && first_negative < 0)
                    first_negative = out;
                rows[out] = id < 0 ? 0 : id % (int64_t)c.table_size;
            } else {
                rows[out] = dlrm_embedding_row(key, salt, c.table_size);
            }
            keys[out] = key;
            ++out;
        }
        lengths[r] = (int32_t)(out - first);
    }
    chunk->written = out;
    chunk->first_negative = first_negative;
}

/* The value range [begin, end) of row r of a chunk (its list, or the row itself); 0 for
 * a null list. */
static inline __attribute__((always_inline)) int32_t row_values(const dlrm_ids *c, int64_t r, int64_t *begin,
                                                                int64_t *end) {
    *begin = r;
    *end = r + 1;
    if (c->list_offsets) {
        int64_t l = c->list_offset + r;
        if (!valid(c->list_validity, l))
            return 0;
        if (c->list_offsets_64) {
            *begin = ((const int64_t *)c->list_offsets)[l];
            *end = ((const int64_t *)c->list_offsets)[l + 1];
        } else {
            *begin = ((const int32_t *)c->list_offsets)[l];
            *end = ((const int32_t *)c->list_offsets)[l + 1];
        }
    }
    return 1;
}

/* id_bags_of for a dictionary-encoded chunk (kind: its indices'): each value's key and
 * row are its entry's, and the first value of each entry lists the entry's key in
 * distinct (the marks). The entry AHEAD values on is prefetched: a large dictionary's
 * entries are read at random. */
static inline __attribute__((always_inline)) void dictionary_bags_of(dlrm_ids *chunk, const int32_t kind,
                                                                     int32_t modulo, int32_t *restrict lengths,
                                                                     uint64_t *restrict keys, int64_t *restrict rows) {
    enum { AHEAD = 16 };
    const dlrm_ids c = *chunk;
    int64_t out = 0, first_negative = -1, distinct = 0, begin, end, last = c.length;
    if (c.list_offsets) /* the values of the lists end where the last list's offsets say */
        last = c.list_offsets_64 ? ((const int64_t *)c.list_offsets)[c.list_offset + c.length]
                                 : ((const int32_t *)c.list_offsets)[c.list_offset + c.length];
    last += c.offset;
    for (int64_t r = 0; r < c.length; ++r) {
        if (!row_values(&c, r, &begin, &end)) {
            lengths[r] = 0;
            continue;
        }
        int64_t first = out;
        for (int64_t i = c.offset + begin; i < c.offset + end; ++i) {
            if (i + AHEAD < last) /* a null's index may be anything: a prefetch never faults */
                __builtin_prefetch(&c.entries[index_at(&c, kind, i + AHEAD)]);
            if (!valid(c.validity, i))
                continue;
            int64_t index = index_at(&c, kind, i);
            dlrm_entry entry = c.entries[index];
            keys[out] = entry.key;
            rows[out] = entry.row;
            if (!((c.marks[index >> 3] >> (index & 7)) & 1)) {
                c.marks[index >> 3] |= (uint8_t)(1u << (index & 7));
                c.distinct[distinct++] = entry.key;
            }
            if (modulo && (int64_t)entry.key < 0 && first_negative < 0)
                first_negative = out;
            ++out;
        }
        lengths[r] = (int32_t)(out - first);
    }
    chunk->written = out;
    chunk->first_negative = first_negative;
    chunk->distinct_written = distinct;
}

static void id_bags(dlrm_ids *c, int32_t modulo, uint64_t salt, int32_t *lengths, uint64_t *keys, int64_t *rows) {
    if (c->entries) {
        switch (c->kind) {
        case KIND_INT8: dictionary_bags_of(c, KIND_INT8, modulo, lengths, keys, rows); break;
        case KIND_INT16: dictionary_bags_of(c, KIND_INT16, modulo, lengths, keys, rows); break;
        case KIND_INT32: dictionary_bags_of(c, KIND_INT32, modulo, lengths, keys, rows); break;
        case KIND_INT64: dictionary_bags_of(c, KIND_INT64, modulo, lengths, keys, rows); break;
        case KIND_UINT8: dictionary_bags_of(c, KIND_UINT8, modulo, lengths, keys, rows); break;
        case KIND_UINT16: dictionary_bags_of(c, KIND_UINT16, modulo, lengths, keys, rows); break;
        case KIND_UINT32: dictionary_bags_of(c, KIND_UINT32, modulo, lengths, keys, rows); break;
        default: dictionary_bags_of(c, KIND_UINT64, modulo, lengths, keys, rows); break;
        }
        return;
    }
    switch (c->kind) {
    case KIND_INT8: id_bags_of(c, KIND_INT8, modulo, salt, lengths, keys, rows); break;
    case KIND_INT16: id_bags_of(c, KIND_INT16, modulo, salt, lengths, keys, rows); break;
    case KIND_INT32: id_bags_of(c, KIND_INT32, modulo, salt, lengths, keys, rows); break;
    case KIND_INT64: id_bags_of(c, KIND_INT64, modulo, salt, lengths, keys, rows); break;
    case KIND_UINT8: id_bags_of(c, KIND_UINT8, modulo, salt, lengths, keys, rows); break;
    case KIND_UINT16: id_bags_of(c, KIND_UINT16, modulo, salt, lengths, keys, rows); break;
    case KIND_UINT32: id_bags_of(c, KIND_UINT32, modulo, salt, lengths, keys, rows); break;
    case KIND_UINT64: id_bags_of(c, KIND_UINT64, modulo, salt, lengths, keys, rows); break;
    case KIND_STRING32: id_bags_of(c, KIND_STRING32, modulo, salt, lengths, keys, rows); break;
    default: id_bags_of(c, KIND_STRING64, modulo, salt, lengths, keys, rows); break;
    }
}

/* The bags of chunks[0..count), one after the other: every row's ids (a null row is an
 * empty bag, a null inside a list is left out) as keys (their 64-bit keys) and rows
 * (their embedding rows: modulo 0, the hash with salt; 1, the key as int64 modulo the
 * table size), the chunks' ids back to back, and each row's bag size in lengths, from
 * the chunk's lengths_at on. keys and rows hold room for every value of every chunk.
 * Returns the ids written; each chunk's written and first_negative tell where they are. */
int64_t dlrm_id_bags(dlrm_ids *chunks, int64_t count, int32_t modulo, uint64_t salt, int32_t *lengths, uint64_t *keys,
                     int64_t *rows) {
    int64_t ids = 0;
    for (int64_t c = 0; c < count; ++c) {
        id_bags(&chunks[c], modulo, salt, lengths + chunks[c].lengths_at, keys + ids, rows + ids);
        ids += chunks[c].written;
    }
    return ids;
}

/* A chunk of a dense column. */
typedef struct {
    const uint8_t *validity; /* NULL: no null */
    int64_t offset;
    const void *data;
    int64_t length;
    int32_t kind;
    int32_t column; /* of the output matrix; a column's chunks come in row order */
} dlrm_dense_chunk;

#define DENSE_LOOP(type)                                                                          \
    for (int64_t r = 0; r < c->length; ++r) {                                                     \
        int64_t i = c->offset + r;                                                                \
        double x = valid(c->validity, i) ? (double)((const type *)c->data)[i] : 0.0;              \
        if (!isfinite(x))                                                                         \
            return r;                                                                             \
        if (clamp)                                                                                \
            x = x > 0.0 ? x : 0.0; /* -0.0 -> +0.0, as numpy.maximum(x, 0.0) */                  \
        if (wide)                                                                                 \
            ((double *)out)[r * stride] = x;                                                      \
        else                                                                                      \
            ((float *)out)[r * stride] = (float)x;                                                \
    }                                                                                             \
    return -1;

static int64_t dense(const dlrm_dense_chunk *c, int32_t clamp, void *out, int32_t wide, int64_t stride) {
    switch (c->kind) {
    case KIND_INT8: DENSE_LOOP(int8_t)
    case KIND_INT16: DENSE_LOOP(int16_t)
    case KIND_INT32: DENSE_LOOP(int32_t)
    case KIND_INT64: DENSE_LOOP(int64_t)
    case KIND_UINT8: DENSE_LOOP(uint8_t)
    case KIND_UINT16: DENSE_LOOP(uint16_t)
    case KIND_UINT32: DENSE_LOOP(uint32_t)
    case KIND_UINT64: DENSE_LOOP(uint64_t)
    case KIND_FLOAT32: DENSE_LOOP(float)
    default: DENSE_LOOP(double)
    }
}

/* The dense chunks[0..count) into the row-major matrix out (stride columns; doubles when
 * wide, else floats): nulls as 0, with clamp max(x, 0) (log1p's input: numpy applies
 * log1p to the whole matrix, the reference's own function). Returns the row (in its
 * column) of the first NaN or infinite value and its chunk in *bad_chunk (nothing after
 * it written), or -1. */
int64_t dlrm_dense(const dlrm_dense_chunk *chunks, int64_t count, int32_t clamp, void *out, int32_t wide,
                   int64_t stride, int64_t *bad_chunk) {
    int64_t row = 0;
    size_t size = wide ? sizeof(double) : sizeof(float);
    for (int64_t c = 0; c < count; ++c) {
        if (c > 0 && chunks[c].column != chunks[c - 1].column)
            row = 0;
        char *at = (char *)out + (size_t)(row * stride + chunks[c].column) * size;
        int64_t bad = dense(&chunks[c], clamp, at, wide, stride);
        if (bad >= 0) {
            *bad_chunk = c;
            return row + bad;
        }
        row += chunks[c].length;
    }
    return -1;
}

/* Sets the Bloom filter bits of keys[0..n) in packed (bits = 8 x its bytes, a power of
 * 2, at least 512) as data/parquet/id_sketch.py's `_positions` (the reference) places
 * them: all `hashes` (at most 4) bits of a key in one 512-bit block (a cache line), with h
 * the key's hash with salt, block (h >> 36) mod (bits / 512), bit i at (h >> 9i) mod 512.
 * Each key's line is prefetched 32 keys before its bits are set, so that the misses
 * overlap (a third faster than blocks of 64 keys prefetched together, on an 8 MiB
 * filter of huge pages: 14 against 25 ns a key). Not thread-safe: the caller holds
 * the filter's lock (one a filter: several threads add to different filters at once). */
void dlrm_bloom_add(uint8_t *packed, uint64_t bits, const uint64_t *keys, int64_t n, uint64_t salt, int32_t hashes) {
    /* A ring of the next AHEAD keys' hashes: key k + AHEAD's line is prefetched as key
     * k's bits are set, so that every miss has the same head start. */
    enum { AHEAD = 32 };
    uint64_t ring[AHEAD];
    const uint64_t blocks = bits / 512;
    for (int64_t k = 0; k < n + AHEAD; ++k) {
        if (k >= AHEAD) {
            uint64_t h = ring[k % AHEAD];
            uint8_t *block = packed + ((h >> 36) & (blocks - 1)) * 64;
            /* A key seen before (most, in a skewed id stream or a second epoch) writes
             * nothing: its line stays clean, and is not written back to memory. */
            int32_t held = 1;
            for (int32_t i = 0; i < hashes && i < 4; ++i) {
                uint64_t position = (h >> (9 * i)) & 511ull;
                held &= (block[position >> 3] >> (position & 7)) & 1;
            }
            if (!held) {
                for (int32_t i = 0; i < hashes && i < 4; ++i) {
                    uint64_t position = (h >> (9 * i)) & 511ull;
                    block[position >> 3] |= (uint8_t)(1u << (position & 7));
                }
            }
        }
        if (k < n) {
            uint64_t h = dlrm_hash(keys[k], salt);
            ring[k % AHEAD] = h;
            __builtin_prefetch(packed + ((h >> 36) & (blocks - 1)) * 64, 1, 0);
        }
    }
}

/* The keys whose hash with salt has its top level bits 0 (1 <= level <= 63), in order,
 * into out (room for n): data/parquet/id_collisions.py's sample. Returns how many. */
int64_t dlrm_sample_keys(const uint64_t *keys, int64_t n, uint64_t salt, int32_t level, uint64_t *out) {
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
        if ((dlrm_hash(keys[i], salt) >> (64 - level)) == 0)
            out[kept++] = keys[i];
    }
    return kept;
}

/* Adds keys[0..n) whose sampling hash has its top level bits 0 (all of them at level 0)
 * to a set of distinct keys (data/parquet/id_collisions.py): open addressing with linear
 * probing over slots[capacity] (a power of 2), an empty slot holding `empty`, a key equal
 * to `empty` recorded in *has_empty instead. *count is the number of distinct keys held.
 * Stops once *count reaches limit (the set must grow or be sampled more sparsely first);
 * returns how many keys it went through. */
int64_t dlrm_set_add(uint64_t *slots, int64_t capacity, uint64_t empty, int32_t *has_empty, int64_t *count,
                     const uint64_t *keys, int64_t n, uint64_t salt, int32_t level, int64_t limit) {
    const uint64_t mask = (uint64_t)capacity - 1;
    int64_t held = *count;
    int64_t i = 0;
    /* Blocks of keys: their first slots are prefetched before any is probed, so that the
     * cache misses of a large table overlap instead of coming one after the other. */
    enum { BLOCK = 16 };
    uint64_t block[BLOCK], first[BLOCK];
    while (i < n && held < limit) {
        int64_t taken = 0;
        while (i < n && taken < BLOCK && held + taken < limit) {
            uint64_t key = keys[i++];
            if (level > 0 && (dlrm_hash(key, salt) >> (64 - level)) != 0)
                continue;
            block[taken] = key;
            first[taken] = dlrm_mix(key) & mask;
            __builtin_prefetch(&slots[first[taken]]);
            ++taken;
        }
        for (int64_t b = 0; b < taken; ++b) {
            uint64_t key = block[b];
            if (key == empty) {
                held += !*has_empty;
                *has_empty = 1;
                continue;
            }
            uint64_t at = first[b];
            while (slots[at] != empty && slots[at] != key)
                at = (at + 1) & mask;
            if (slots[at] == empty) {
                slots[at] = key;
                ++held;
            }
        }
    }
    *count = held;
    return i;
}
