/* The search's int8 first pass and its exact second pass, in plain C. Loaded by coclr/embed/search_cpu.py.
 *
 * First pass: scores[i][j] = (float)(dot(rows[i], queries[j]) - offsets[j]) * (row_scale[i] * query_scale[j]),
 * where rows are unsigned bytes (a row's int8 values plus 128) and queries signed bytes in [-63, 63]: every pair
 * of products sums to at most 2 * 255 * 63 = 32130, so AVX2's saturating vpmaddubsw never saturates and every
 * path (AVX2, AVX-512 VNNI, plain C) computes the same integers, hence the same floats. offsets[j] is 128 times
 * the sum of query j (what the +128 of the rows added). dim is a multiple of 64 (the rows and queries are padded
 * with zero products). Its range form (coclr_i8_over_floor) compares each score with its query's floor instead of
 * storing it, and writes only the pairs that reach it.
 *
 * The queries come packed in blocks of BLOCK (coclr_i8_block()): block b holds, for each four bytes of a row
 * (k = 0, 4, 8, ...), bytes k..k+3 of each of its BLOCK queries in turn ([nq / BLOCK][dim / 4][BLOCK][4]). Four
 * bytes of a row, broadcast to every lane, then meet BLOCK queries in a few multiplies, and each lane keeps one
 * query's sum: no horizontal sums, which at short rows cost as much as the products. The query arrays (packed
 * bytes, offsets, scales, floors) hold nq rounded up to a multiple of BLOCK (zero queries with +inf floors); the
 * scores written are those of the nq real ones.
 *
 * Second pass: out[p] = the float64 dot product of rows32[row[p]] and queries32[query[p]]: exact in any order for
 * the quantised unit rows of coclr.eval.exact, so its summation order does not matter.
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>

/* The four bytes at p as one int32, to broadcast (p need not be aligned). */
static int32_t four_bytes(const uint8_t *p) {
    int32_t value;
    memcpy(&value, p, 4);
    return value;
}
#endif

/* A score from its integer dot product: what every kernel computes, in this order. */
static inline float finish(int32_t dot, int32_t offset, float row_scale, float query_scale) {
    return (float)(dot - offset) * (row_scale * query_scale);
}

/* The vector kernels, one set of macros per instruction set for the block and epilogue below. LANES: int32 sums a
 * vector; VECS: vectors of queries a block (BLOCK = LANES * VECS queries); ROWS: rows a block. BCAST(p): the four
 * bytes at p in every lane; DOT(acc, r, q): acc += the byte products of r (unsigned) and q (signed), four to each
 * lane; SCORE(acc, j, rs): the lanes' scores as finish() computes them (the same operations in the same order, so
 * the same floats); OVER(score, j): a bit per lane whose score reaches its floor. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define KERNEL "avx512_vnni"
#define LANES 16
#define VECS 2
#define ROWS 8
#define VEC __m512i
#define FVEC __m512
#define ZERO _mm512_setzero_si512()
#define ONES
#define QLOAD(p) _mm512_loadu_si512((const void *)(p))
#define BCAST(p) _mm512_set1_epi32(four_bytes(p))
/* vpdpbusd: u8 x s8, four products to an int32, exact. */
#define DOT(acc, r, q) acc = _mm512_dpbusd_epi32(acc, r, q)
#define SCORE(acc, j, rs) _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32( \
    acc, _mm512_loadu_si512((const void *)(offsets + (j))))), _mm512_mul_ps(_mm512_set1_ps(rs), \
    _mm512_loadu_ps(query_scale + (j))))
#define STOREF(p, v) _mm512_storeu_ps(p, v)
#define OVER(score, j) ((unsigned)_mm512_cmp_ps_mask(score, _mm512_loadu_ps(floors + (j)), _CMP_GE_OQ))
#elif defined(__AVX2__)
#define KERNEL "avx2"
#define LANES 8
#define VECS 2
#define ROWS 4
#define VEC __m256i
#define FVEC __m256
#define ZERO _mm256_setzero_si256()
#define ONES const __m256i ones = _mm256_set1_epi16(1);
#define QLOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define BCAST(p) _mm256_set1_epi32(four_bytes(p))
/* vpmaddubsw (pairs of u8 x s8 to int16, below saturation by the queries' range), then vpmaddwd with ones (pairs
 * of int16 to int32). */
#define DOT(acc, r, q) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(r, q), ones))
#define SCORE(acc, j, rs) _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32( \
    acc, _mm256_loadu_si256((const __m256i *)(offsets + (j))))), _mm256_mul_ps(_mm256_set1_ps(rs), \
    _mm256_loadu_ps(query_scale + (j))))
#define STOREF(p, v) _mm256_storeu_ps(p, v)
#define OVER(score, j) ((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(score, _mm256_loadu_ps(floors + (j)), _CMP_GE_OQ)))
#else
#define KERNEL "plain"
#define LANES 1
#define VECS 1
#define ROWS 1
#endif
#define BLOCK (LANES * VECS)

/* Which kernel this build runs (for the tests and the benchmarks' log), and how many queries a packed block holds. */
const char *coclr_i8_kernel(void) { return KERNEL; }
int coclr_i8_block(void) { return BLOCK; }

#ifdef VEC
/* R rows (at rows, dim apart) against one packed block of queries: acc[a * VECS + v] holds row a's sums with the
 * block's queries v * LANES .. v * LANES + LANES - 1. Inlined with R constant, the accumulators stay in registers. */
static inline __attribute__((always_inline)) void block(const uint8_t *restrict rows, const int8_t *restrict packed,
                                                        int dim, int R, VEC *restrict acc) {
    ONES
    for (int t = 0; t < R * VECS; t++) acc[t] = ZERO;
    for (int k = 0; k < dim; k += 4) {
        VEC q[VECS];
        for (int v = 0; v < VECS; v++) q[v] = QLOAD(packed + (long)k * BLOCK + v * LANES * 4);
        for (int a = 0; a < R; a++) {
            VEC r = BCAST(rows + (long)a * dim + k);
            for (int v = 0; v < VECS; v++) DOT(acc[a * VECS + v], r, q[v]);
        }
    }
}

/* Rows i .. i + R - 1 against the block of queries from jb: scores written (out, nq columns, only the real
 * queries') or, with floors, the pairs that reach them appended to hit_row, hit_query. */
static inline __attribute__((always_inline)) void rows_block(
        const uint8_t *restrict rows, const int8_t *restrict packed, const float *restrict row_scale,
        const float *restrict query_scale, const int32_t *restrict offsets, const float *restrict floors, long i,
        int jb, int nq, int dim, int R, float *restrict out, long capacity, long *found, int64_t *restrict hit_row,
        int64_t *restrict hit_query, float *restrict hit_score) {
    VEC acc[ROWS * VECS];
    block(rows + i * (long)dim, packed + (long)jb * dim, dim, R, acc);
    for (int a = 0; a < R; a++)
        for (int v = 0; v < VECS; v++) {
            int j = jb + v * LANES;
            FVEC score = SCORE(acc[a * VECS + v], j, row_scale[i + a]);
            if (floors == 0) {
                if (j + LANES <= nq) {
                    STOREF(out + (i + a) * nq + j, score);
                } else if (j < nq) {
                    float part[LANES];
                    STOREF(part, score);
                    memcpy(out + (i + a) * nq + j, part, sizeof(float) * (nq - j));
                }
                continue;
            }
            unsigned over = OVER(score, j);
            if (!over) continue;
            float part[LANES];
            STOREF(part, score);
            for (; over; over &= over - 1) {
                int b = __builtin_ctz(over);
                if (*found < capacity) {
                    hit_row[*found] = i + a;
                    hit_query[*found] = j + b;
                    if (hit_score) hit_score[*found] = part[b];
                }
                (*found)++;
            }
        }
}
#else
static void rows_block(const uint8_t *restrict rows, const int8_t *restrict packed, const float *restrict row_scale,
                       const float *restrict query_scale, const int32_t *restrict offsets,
                       const float *restrict floors, long i, int jb, int nq, int dim, int R, float *restrict out,
                       long capacity, long *found, int64_t *restrict hit_row, int64_t *restrict hit_query,
                       float *restrict hit_score) {
    (void)R;
    const uint8_t *row = rows + i * (long)dim;
    const int8_t *query = packed + (long)jb * dim;
    int32_t dot = 0;
    for (int k = 0; k < dim; k++) dot += (int32_t)row[k] * (int32_t)query[k];
    float score = finish(dot, offsets[jb], row_scale[i], query_scale[jb]);
    if (floors == 0) {
        if (jb < nq) out[i * nq + jb] = score;
    } else if (score >= floors[jb]) {
        if (*found < capacity) {
            hit_row[*found] = i;
            hit_query[*found] = jb;
            if (hit_score) hit_score[*found] = score;
        }
        (*found)++;
    }
}
#endif

/* Rows [first, last) against every query, tiled: the queries a span at a time (1 MiB of them, in L2), the rows a
 * run at a time (128 KiB, in L2 beside them), and within those each block of queries (in L1) against the run's
 * rows, ROWS at a time. Scores (floors 0) or pairs over the floors (see rows_block); inlined into each of the two
 * callers below, so that each is compiled for its one form. */
static inline __attribute__((always_inline)) long tiled(
        const uint8_t *restrict rows, const int8_t *restrict packed, const float *restrict row_scale,
        const float *restrict query_scale, const int32_t *restrict offsets, const float *restrict floors, long first,
        long last, int nq, int dim, float *restrict out, long capacity, int64_t *restrict hit_row,
        int64_t *restrict hit_query, float *restrict hit_score) {
    int padded = (nq + BLOCK - 1) / BLOCK * BLOCK;
    int span = (int)(1048576L / dim) / BLOCK * BLOCK;
    long run = (long)((131072 / dim) / ROWS * ROWS);
    long found = 0;
    if (span < BLOCK) span = BLOCK;
    if (run < ROWS) run = ROWS;
    for (int s0 = 0; s0 < padded; s0 += span) {
        int s1 = s0 + span < padded ? s0 + span : padded;
        for (long start = first; start < last; start += run) {
            long stop = start + run < last ? start + run : last;
            for (int jb = s0; jb < s1; jb += BLOCK) {
                long i = start;
                for (; i + ROWS <= stop; i += ROWS)
                    rows_block(rows, packed, row_scale, query_scale, offsets, floors, i, jb, nq, dim, ROWS, out,
                               capacity, &found, hit_row, hit_query, hit_score);
                for (; i < stop; i++)
                    rows_block(rows, packed, row_scale, query_scale, offsets, floors, i, jb, nq, dim, 1, out,
                               capacity, &found, hit_row, hit_query, hit_score);
            }
        }
    }
    return found;
}

/* Rows [first, last) of rows [n, dim] against the packed queries; scores [n, nq] row-major (only rows first..last
 * written). Returns 0. */
int coclr_i8_scores(const uint8_t *restrict rows, const int8_t *restrict packed, const float *restrict row_scale,
                    const float *restrict query_scale, const int32_t *restrict offsets, long first, long last,
                    int nq, int dim, float *restrict scores) {
    tiled(rows, packed, row_scale, query_scale, offsets, 0, first, last, nq, dim, scores, 0, 0, 0, 0);
    return 0;
}

/* Rows [first, last) against the packed queries, like coclr_i8_scores, but only the pairs whose score is at least
 * their query's floor (floors[j]) are written: to hit_row, hit_query and (unless it is null) hit_score, up to
 * capacity of them, in the order found. Returns how many there were (more than capacity: the caller asks again
 * with room for them). A range search's first pass: the scores are compared while in registers, and no block of
 * them is ever stored. */
long coclr_i8_over_floor(const uint8_t *restrict rows, const int8_t *restrict packed, const float *restrict row_scale,
                         const float *restrict query_scale, const int32_t *restrict offsets,
                         const float *restrict floors, long first, long last, int nq, int dim, long capacity,
                         int64_t *restrict hit_row, int64_t *restrict hit_query, float *restrict hit_score) {
    return tiled(rows, packed, row_scale, query_scale, offsets, floors, first, last, nq, dim, 0, capacity, hit_row,
                 hit_query, hit_score);
}

/* out[p] = sum_k (double)rows[row[p]][k] * (double)queries[query[p]][k] for p in [first, last). Returns 0. */
int coclr_pair_dots(const float *restrict rows, const float *restrict queries, const int64_t *restrict row,
                    const int64_t *restrict query, long first, long last, int dim, double *restrict out) {
    for (long p = first; p < last; p++) {
        const float *a = rows + row[p] * (long)dim, *b = queries + query[p] * (long)dim;
        double sums[8] = {0};  /* eight running sums (vectorised): exact, so the order is free */
        int k = 0;
        for (; k + 8 <= dim; k += 8)
            for (int l = 0; l < 8; l++) sums[l] += (double)a[k + l] * (double)b[k + l];
        for (; k < dim; k++) sums[0] += (double)a[k] * (double)b[k];
        out[p] = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
    }
    return 0;
}
