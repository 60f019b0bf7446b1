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
 * Second pass: out[p] = the float64 dot product of rows32[row[p]] and queries32[query[p]]: exact in any order for
 * the quantised unit rows of coclr.eval.exact, so its summation order does not matter.
 */
#include <stdint.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static float finish(int32_t dot, int32_t offset, float row_scale, float query_scale) {
    return (float)(dot - offset) * (row_scale * query_scale);
}

/* The plain loop: one row against one query (tails, and CPUs without AVX2). */
static int32_t dot_u8_s8(const uint8_t *restrict row, const int8_t *restrict query, int dim) {
    int32_t sum = 0;
    for (int k = 0; k < dim; k++) sum += (int32_t)row[k] * (int32_t)query[k];
    return sum;
}

/* The vector kernels: one block function (below) over these per instruction set. VEC: a vector of int32 sums;
 * STEP: bytes a step; LOAD: unaligned load; ZERO: a zero vector; DOT(acc, r, q): acc += the byte products of r
 * (unsigned) and q (signed), four to each int32; SUMS(out, a, b, c, d): out[0..3] = the totals of a, b, c, d. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define KERNEL "avx512_vnni"
#define VEC __m512i
#define STEP 64
#define LOAD(p) _mm512_loadu_si512((const void *)(p))
#define ZERO _mm512_setzero_si512()
#define ONES
/* vpdpbusd: u8 x s8, four products to an int32, exact. */
#define DOT(acc, r, q) acc = _mm512_dpbusd_epi32(acc, r, q)
#define SUMS(out, a, b, c, d) _mm_storeu_si128((__m128i *)(out), sum4(a, b, c, d))
/* The totals of four vectors of sixteen int32, as one vector of four: interleave and add pairwise (each 128-bit lane
 * then holds a part of each total), then add the lanes; far fewer steps than four separate reductions, which at
 * short rows cost more than the products. */
static __m128i sum4(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i all = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(all), _mm512_extracti64x4_epi64(all, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}
#elif defined(__AVX2__)
#define KERNEL "avx2"
#define VEC __m256i
#define STEP 32
#define LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define ZERO _mm256_setzero_si256()
#define ONES const __m256i ones = _mm256_set1_epi16(1);
/* vpmaddubsw (pairs of u8 x s8 to int16, below saturation by the queries' range), then vpmaddwd with ones (pairs
 * of int16 to int32). */
#define DOT(acc, r, q) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(r, q), ones))
#define SUMS(out, a, b, c, d) _mm_storeu_si128((__m128i *)(out), sum4(a, b, c, d))
/* The totals of four vectors of eight int32, as one vector of four (horizontal adds: fewer steps than four sums). */
static __m128i sum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}
#endif

#ifdef VEC
#define ROWS 2
#define QUERIES 4
/* ROWS rows against QUERIES queries, STEP bytes a step. The accumulators are named variables, not an array, so
 * that they stay in registers. */
static void block(const uint8_t *restrict rows, const int8_t *restrict queries, int dim, int32_t *dots) {
    ONES
    VEC a00 = ZERO, a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (int k = 0; k < dim; k += STEP) {
        VEC r0 = LOAD(rows + k), r1 = LOAD(rows + dim + k);
        VEC q = LOAD(queries + k);
        DOT(a00, r0, q); DOT(a10, r1, q);
        q = LOAD(queries + dim + k);
        DOT(a01, r0, q); DOT(a11, r1, q);
        q = LOAD(queries + 2L * dim + k);
        DOT(a02, r0, q); DOT(a12, r1, q);
        q = LOAD(queries + 3L * dim + k);
        DOT(a03, r0, q); DOT(a13, r1, q);
    }
    SUMS(dots, a00, a01, a02, a03);
    SUMS(dots + 4, a10, a11, a12, a13);
}
#else
#define KERNEL "plain"
#define ROWS 1
#define QUERIES 1
static void block(const uint8_t *restrict rows, const int8_t *restrict queries, int dim, int32_t *dots) {
    dots[0] = dot_u8_s8(rows, queries, dim);
}
#endif

/* Which kernel this build runs (for the tests and the benchmarks' log). */
const char *coclr_i8_kernel(void) { return KERNEL; }

/* Scores of rows [first, last) against queries [j0, j1), written into scores [n, nq]. */
static void tile(const uint8_t *restrict rows, const int8_t *restrict queries, const float *restrict row_scale,
                 const float *restrict query_scale, const int32_t *restrict offsets, long first, long last, int j0,
                 int j1, int nq, int dim, float *restrict scores) {
    int32_t dots[ROWS * QUERIES];
    long i = first;
    for (; i + ROWS <= last; i += ROWS) {
        int j = j0;
        for (; j + QUERIES <= j1; j += QUERIES) {
            block(rows + i * (long)dim, queries + (long)j * dim, dim, dots);
            for (int a = 0; a < ROWS; a++)
                for (int b = 0; b < QUERIES; b++)
                    scores[(i + a) * nq + j + b] = finish(dots[a * QUERIES + b], offsets[j + b], row_scale[i + a],
                                                          query_scale[j + b]);
        }
        for (; j < j1; j++)
            for (int a = 0; a < ROWS; a++)
                scores[(i + a) * nq + j] = finish(dot_u8_s8(rows + (i + a) * (long)dim, queries + (long)j * dim, dim),
                                                  offsets[j], row_scale[i + a], query_scale[j]);
    }
    for (; i < last; i++)
        for (int j = j0; j < j1; j++)
            scores[i * nq + j] = finish(dot_u8_s8(rows + i * (long)dim, queries + (long)j * dim, dim), offsets[j],
                                        row_scale[i], query_scale[j]);
}

/* Rows [first, last) of rows [n, dim] against queries [nq, dim]; scores [n, nq] row-major (only rows first..last
 * written). The work goes in tiles: a group of queries that fits the L1 cache beside a block of rows, against a
 * run of rows that fits L2 (measured on one Xeon core: the VNNI kernel 95 G multiply-adds/s tiled against 67 not;
 * the AVX2 one, bound by its multiply-adds, the same either way). Returns 0. */
int coclr_i8_scores(const uint8_t *restrict rows, const int8_t *restrict queries, const float *restrict row_scale,
                    const float *restrict query_scale, const int32_t *restrict offsets, long first, long last,
                    int nq, int dim, float *restrict scores) {
    int group = (16384 / dim) / QUERIES * QUERIES;
    long run = (long)((131072 / dim) / ROWS * ROWS);
    if (group < QUERIES) group = QUERIES;
    if (run < ROWS) run = ROWS;
    for (long start = first; start < last; start += run) {
        long stop = start + run < last ? start + run : last;
        for (int j0 = 0; j0 < nq; j0 += group)
            tile(rows, queries, row_scale, query_scale, offsets, start, stop, j0, j0 + group < nq ? j0 + group : nq,
                 nq, dim, scores);
    }
    return 0;
}

/* Rows [first, last) against queries [nq, dim], like coclr_i8_scores, but no score is stored: the pairs whose
 * score is at least their query's floor (floors[j]) are written to hit_row, hit_query (up to capacity of them, in
 * the order found). Returns how many there were (more than capacity: the caller asks again with room for them).
 * A range search's first pass: the scores are compared while in registers, never written to memory. */
long coclr_i8_over_floor(const uint8_t *restrict rows, const int8_t *restrict queries, const float *restrict row_scale,
                         const float *restrict query_scale, const int32_t *restrict offsets,
                         const float *restrict floors, long first, long last, int nq, int dim, long capacity,
                         int64_t *restrict hit_row, int64_t *restrict hit_query) {
    int group = (16384 / dim) / QUERIES * QUERIES;
    long run = (long)((131072 / dim) / ROWS * ROWS);
    long found = 0;
    int32_t dots[ROWS * QUERIES];
    if (group < QUERIES) group = QUERIES;
    if (run < ROWS) run = ROWS;
#define HIT(i, j, dot) do { \
        if (finish((dot), offsets[j], row_scale[i], query_scale[j]) >= floors[j]) { \
            if (found < capacity) { hit_row[found] = (i); hit_query[found] = (j); } \
            found++; \
        } } while (0)
    /* Queries a span at a time, a span that fits L2 (1 MiB of them), so that a run of rows meets queries from L2,
     * not from memory, however many queries there are. */
    int span = (int)(1048576L / dim) / group * group;
    if (span < group) span = group;
    for (int s0 = 0; s0 < nq; s0 += span)
    for (long start = first; start < last; start += run) {
        long stop = start + run < last ? start + run : last;
        int s1 = s0 + span < nq ? s0 + span : nq;
        for (int j0 = s0; j0 < s1; j0 += group) {
            int j1 = j0 + group < s1 ? j0 + group : s1;
            long i = start;
            for (; i + ROWS <= stop; i += ROWS) {
                int j = j0;
                for (; j + QUERIES <= j1; j += QUERIES) {
                    block(rows + i * (long)dim, queries + (long)j * dim, dim, dots);
                    for (int a = 0; a < ROWS; a++) {
#ifdef VEC
                        /* The four scores of a row at once: the same operations as finish(), in the same order,
                         * so the same floats; a bit per score that reaches its floor. */
                        __m128 score = _mm_mul_ps(
                            _mm_cvtepi32_ps(_mm_sub_epi32(_mm_loadu_si128((const __m128i *)(dots + a * QUERIES)),
                                                          _mm_loadu_si128((const __m128i *)(offsets + j)))),
                            _mm_mul_ps(_mm_set1_ps(row_scale[i + a]), _mm_loadu_ps(query_scale + j)));
                        int over = _mm_movemask_ps(_mm_cmpge_ps(score, _mm_loadu_ps(floors + j)));
                        for (; over; over &= over - 1) {
                            int b = __builtin_ctz(over);
                            if (found < capacity) { hit_row[found] = i + a; hit_query[found] = j + b; }
                            found++;
                        }
#else
                        for (int b = 0; b < QUERIES; b++) HIT(i + a, j + b, dots[a * QUERIES + b]);
#endif
                    }
                }
                for (; j < j1; j++)
                    for (int a = 0; a < ROWS; a++)
                        HIT(i + a, j, dot_u8_s8(rows + (i + a) * (long)dim, queries + (long)j * dim, dim));
            }
            for (; i < stop; i++)
                for (int j = j0; j < j1; j++) HIT(i, j, dot_u8_s8(rows + i * (long)dim, queries + (long)j * dim, dim));
        }
    }
#undef HIT
    return found;
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
