/* The id hash of --id_hashing hash (docs/data.md, "Raw ids to embedding rows: the hash"),
 * in C: the one definition the Parquet column kernels (columns.c) and the C++ predictor
 * (serving/cpp/dlrm_predict.cpp) both include, so that they cannot drift apart. The numpy
 * reference (data/parquet/id_hashing.py) is tested against it bit for bit
 * (tests/data/test_parquet_kernel.py, tests/serving/test_cpp_parquet.py).
 *
 * A raw value's 64-bit key: an integer of any width is its 64-bit two's complement
 * pattern (sign-extended when signed), a string or binary value the 64-bit FNV-1a of its
 * bytes. Its row: mix(key ^ mix(seed)) % table_size, mix the splitmix64 finalizer. */
#ifndef DLRM_ID_HASH_H
#define DLRM_ID_HASH_H

#include <stddef.h>
#include <stdint.h>

#define DLRM_FNV_OFFSET_BASIS 0xcbf29ce484222325ULL
#define DLRM_FNV_PRIME 0x100000001b3ULL

/* The splitmix64 finalizer, modulo 2**64. */
static inline uint64_t dlrm_mix(uint64_t z) {
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z;
}

/* The key of a string or binary value: 64-bit FNV-1a of its bytes. */
static inline uint64_t dlrm_string_key(const uint8_t *bytes, size_t size) {
    uint64_t key = DLRM_FNV_OFFSET_BASIS;
    for (size_t i = 0; i < size; ++i) {
        key ^= bytes[i];
        key *= DLRM_FNV_PRIME;
    }
    return key;
}

/* The key of an integer: its 64-bit pattern (an unsigned one passes as uint64_t). */
static inline uint64_t dlrm_integer_key(int64_t value) { return (uint64_t)value; }

/* What the seed adds to every key: mix(seed). */
static inline uint64_t dlrm_salt(uint64_t seed) { return dlrm_mix(seed); }

/* The 64-bit hash of a key, the seed given as its salt. */
static inline uint64_t dlrm_hash(uint64_t key, uint64_t salt) { return dlrm_mix(key ^ salt); }

/* The embedding row of a key in a table of table_size rows (0 < table_size < 2**63). */
static inline int64_t dlrm_embedding_row(uint64_t key, uint64_t salt, uint64_t table_size) {
    return (int64_t)(dlrm_hash(key, salt) % table_size);
}

#endif
