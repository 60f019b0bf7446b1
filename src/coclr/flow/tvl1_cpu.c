/* The fused CPU loops of the PyTorch TV-L1 (coclr.flow.tvl1_cpu, which documents the scheme, compiles this file on
   first use with the generated tvl1_median.h beside it, and loads it with ctypes). Every float operation is the
   IEEE float32 operation of PyTorch's scheme, in its order: compiled without fast-math or FMA contraction. */

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define MINF(a, b) ((a) < (b) ? (a) : (b))
#define MAXF(a, b) ((a) < (b) ? (b) : (a))
#define INLINE static inline __attribute__((always_inline))

/* The medians, generated from the comparator networks of coclr.flow.median (tvl1_cpu.median_header): per size
   k, median<k>_columns and median<k>_select, and median_dispatch(dst, h, w, k, pad, ranks). */
#include "tvl1_median.h"

/* Row y of the primal step, every channel: rho, thresholding, divergence (backward differences, zero before the
   first column/row: pyu is row y-1 of py, or a zero row with pyu_plane 0), u = v + theta div; d gets u_new - u.
   The order of every operation is PyTorch's (primal_dual_step, divergence). The left neighbour's index stays in
   the row at x = 0 (its value is then discarded), so every load is unconditional and the loop vectorises. */
INLINE void primal_row(const int ch, float *restrict u, const float *restrict px, const float *restrict py,
                       const float *restrict pyu, const ptrdiff_t pyu_plane, const float *restrict g,
                       const float *restrict rc, const float *restrict ng, float *restrict d,
                       const ptrdiff_t plane, const int w, const float lt, const float theta)
{
    for (int x = 0; x < w; x++) {
        float rho = rc[x];
        for (int c = 0; c < ch; c++) rho = fmaf(g[c * plane + x], u[c * plane + x], rho);
        float s = rho * ng[x];
        s = s < -lt ? -lt : s;
        s = s > lt ? lt : s;
        for (int c = 0; c < ch; c++) {
            const ptrdiff_t o = c * plane + x;
            const float left = x > 0 ? px[o - (x > 0)] : 0.0f;
            float dv = px[o] + py[o];
            dv = dv - left;
            dv = dv - pyu[c * pyu_plane + x];
            const float v = fmaf(s, g[o], u[o]);
            const float nu = v + theta * dv;
            d[c * w + x] = nu - u[o];
            u[o] = nu;
        }
    }
}

/* Pixel x of one channel's row y of the dual step: forward differences of the new u (udc is row y+1, or row y
   itself for the last row, so gy = 0; last: x is the last column, gx = 0) and the projection
   p = (p + tot grad u) / (1 + tot |grad u|). */
INLINE void dual_pixel(const int x, const int last, const float *restrict uc, const float *restrict udc,
                       float *restrict pxc, float *restrict pyc, const float tot)
{
    const float gx = last ? 0.0f : uc[x + 1] - uc[x];
    const float gy = udc[x] - uc[x];
    const float denom = sqrtf(fmaf(gy, gy, gx * gx)) * tot + 1.0f;
    pxc[x] = fmaf(tot, gx, pxc[x]) / denom;
    pyc[x] = fmaf(tot, gy, pyc[x]) / denom;
}

/* Row y of the dual step, every channel: the columns before the last, then the last (apart, so that the row loop
   has no branch: without masked loads, AVX2 has no other way to vectorise it). */
INLINE void dual_row(const int ch, const float *restrict u, const float *restrict ud, float *restrict px,
                     float *restrict py, const ptrdiff_t plane, const int w, const float tot)
{
    for (int c = 0; c < ch; c++) {
        const float *restrict uc = u + c * plane;
        const float *restrict udc = ud + c * plane;
        float *restrict pxc = px + c * plane;
        float *restrict pyc = py + c * plane;
        for (int x = 0; x + 1 < w; x++) dual_pixel(x, 0, uc, udc, pxc, pyc, tot);
        dual_pixel(w - 1, 1, uc, udc, pxc, pyc, tot);
    }
}

/* Sum of d[i]^2 in float64: 8 lanes, then the lanes in order (a fixed order the compiler may vectorise). */
static double row_sum(const float *restrict d, const int n)
{
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lanes[l] += (double)d[i + l] * (double)d[i + l];
    for (int l = 0; i < n; i++, l++) lanes[l] += (double)d[i] * (double)d[i];
    double total = 0.0;
    for (int l = 0; l < 8; l++) total += lanes[l];
    return total;
}

/* One inner iteration over the image in one sweep with a one-row lag; returns sum (u_new - u)^2. */
INLINE double iteration(const int ch, float *u, float *px, float *py, const float *g, const float *rc,
                        const float *ng, const int h, const int w, const float lt, const float theta,
                        const float tot, float *d, const float *zero)
{
    const ptrdiff_t plane = (ptrdiff_t)h * w;
    double total = 0.0;
    for (int y = 0; y < h; y++) {
        const ptrdiff_t r = (ptrdiff_t)y * w;
        primal_row(ch, u + r, px + r, py + r, y > 0 ? py + r - w : zero, y > 0 ? plane : 0, g + r, rc + r, ng + r,
                   d, plane, w, lt, theta);
        total += row_sum(d, ch * w);
        if (y > 0) dual_row(ch, u + r - w, u + r, px + r - w, py + r - w, plane, w, tot);
    }
    const ptrdiff_t last = (ptrdiff_t)(h - 1) * w;
    dual_row(ch, u + last, u + last, px + last, py + last, plane, w, tot);
    return total;
}

static double iteration_any(const int ch, float *u, float *px, float *py, const float *g, const float *rc,
                            const float *ng, const int h, const int w, const float lt, const float theta,
                            const float tot, float *d, const float *zero)
{
    if (ch == 2) return iteration(2, u, px, py, g, rc, ng, h, w, lt, theta, tot, d, zero);
    return iteration(3, u, px, py, g, rc, ng, h, w, lt, theta, tot, d, zero);
}

/* Up to n iterations with the mode's stop test: exact stops after the first iteration whose change is at most
   the threshold; fast runs all n and reports whether any of them met it. Returns the iterations run. */
static int iterations(const int ch, float *u, float *px, float *py, const float *g, const float *rc,
                      const float *ng, const int h, const int w, const int n, const int exact,
                      const float threshold, const float lt, const float theta, const float tot, float *d,
                      const float *zero, int *stopped)
{
    *stopped = 0;
    for (int i = 0; i < n; i++) {
        const double change = iteration_any(ch, u, px, py, g, rc, ng, h, w, lt, theta, tot, d, zero);
        if (exact ? !(change > (double)threshold) : change <= (double)threshold) {  /* PyTorch's tests, NaN too */
            *stopped = 1;
            if (exact) return i + 1;
        }
    }
    return n;
}

/* The k x k median of one plane (replicated borders) into dst: pad, then per output row the column sort and the
   per-rank selections of the generated network. pad: (h + 2r)(w + 2r) floats, ranks: k (w + 2r). */
static void median_plane(const float *src, float *dst, const int h, const int w, const int k, float *pad,
                         float *ranks)
{
    const int r = k / 2, pw = w + 2 * r;
    for (int yy = 0; yy < h + 2 * r; yy++) {
        const int sy = yy < r ? 0 : (yy - r >= h ? h - 1 : yy - r);
        const float *s = src + (ptrdiff_t)sy * w;
        float *row = pad + (ptrdiff_t)yy * pw;
        for (int x = 0; x < r; x++) {
            row[x] = s[0];
            row[r + w + x] = s[w - 1];
        }
        memcpy(row + r, s, sizeof(float) * (size_t)w);
    }
    median_dispatch(dst, h, w, k, pad, ranks);
}

/* Scratch of one call: the change row, a zero row, the median's padded plane, rank rows and output plane. */
static float *scratch(const int ch, const int h, const int w, const int k)
{
    const size_t r = (size_t)(k > 1 ? k / 2 : 0), pw = (size_t)w + 2 * r, kk = (size_t)(k > 1 ? k : 0);
    const size_t n = (size_t)ch * w + (size_t)w + ((size_t)h + 2 * r) * pw + kk * pw + (size_t)h * w;
    return (float *)calloc(n, sizeof(float));
}

/* One pass of n iterations for one pair (the Passes protocol); returns the iterations run, -1 without memory. */
int tvl1_pass(float *u, float *px, float *py, const float *g, const float *rc, const float *ng, int ch, int h,
              int w, int n, int exact, float threshold, float lt, float theta, float tot, int *stopped)
{
    float *buf = scratch(ch, h, w, 0);
    if (!buf) return -1;
    const int done = iterations(ch, u, px, py, g, rc, ng, h, w, n, exact, threshold, lt, theta, tot, buf,
                                buf + (size_t)ch * w, stopped);
    free(buf);
    return done;
}

/* The k x k median of the first `planes` planes of h x w at src into dst; 0, or -1 without memory. */
int tvl1_median(const float *src, float *dst, int planes, int h, int w, int k)
{
    float *buf = scratch(1, h, w, k);
    if (!buf) return -1;
    const size_t pw = (size_t)w + 2 * (size_t)(k / 2);
    float *pad = buf + 2 * (size_t)w, *ranks = pad + ((size_t)h + (size_t)(k - 1)) * pw;
    for (int c = 0; c < planes; c++)
        median_plane(src + (size_t)c * h * w, dst + (size_t)c * h * w, h, w, k, pad, ranks);
    free(buf);
    return 0;
}

/* A whole warp of one pair: `outer` rounds of (the k x k median of u and v when k > 1, then up to `inner`
   iterations in passes of stop_every for fast, one run for exact); it ends when the stop test fires.
   Returns the inner iterations run, -1 without memory. */
long long tvl1_warp(float *u, float *px, float *py, const float *g, const float *rc, const float *ng, int ch,
                    int h, int w, int outer, int inner, int k, int exact, int stop_every, float threshold, float lt,
                    float theta, float tot)
{
    float *buf = scratch(ch, h, w, k);
    if (!buf) return -1;
    float *d = buf, *zero = buf + (size_t)ch * w;
    const size_t pw = (size_t)w + 2 * (size_t)(k > 1 ? k / 2 : 0), plane = (size_t)h * w;
    float *pad = zero + w, *ranks = pad + ((size_t)h + (size_t)(k > 1 ? k - 1 : 0)) * pw;
    float *med = ranks + (size_t)(k > 1 ? k : 0) * pw;
    long long total = 0;
    for (int o = 0; o < outer; o++) {
        if (k > 1)
            for (int c = 0; c < 2; c++) {
                median_plane(u + c * plane, med, h, w, k, pad, ranks);
                memcpy(u + c * plane, med, sizeof(float) * plane);
            }
        int done = 0, stopped = 0;
        while (done < inner) {
            int n = inner - done;
            if (!exact && n > stop_every) n = stop_every;
            total += iterations(ch, u, px, py, g, rc, ng, h, w, n, exact, threshold, lt, theta, tot, d, zero,
                                &stopped);
            done += n;
            if (stopped) {
                free(buf);
                return total;
            }
        }
    }
    free(buf);
    return total;
}
