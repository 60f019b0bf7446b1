/* Max-pooling of channels-last 3D float32 tensors, for inference: the maximum only, without the indices PyTorch's
 * CPU kernel also computes (inference never reads them). Loaded by coclr/models/pool_cpu.py.
 *
 * in:  [N, T, H, W, C] contiguous (a channels-last 3D tensor's memory), out: [N, TO, HO, WO, C] likewise.
 * Window positions in the padding are skipped (PyTorch pads with -inf), and a NaN anywhere in a window is the
 * result, as in PyTorch: a value replaces the running maximum when it is larger or NaN. The maximum is exact, so
 * the output is PyTorch's bit for bit, whatever the order of the positions or the split of the work.
 */
#include <math.h>

/* acc = max(acc, x) over c channels, NaN propagating; the loop the compiler vectorises. */
static void channel_max(float *restrict acc, const float *restrict x, long c) {
    for (long i = 0; i < c; i++) {
        float v = x[i];
        acc[i] = (v > acc[i] || v != v) ? v : acc[i];
    }
}

/* The output planes [first, last) of the flattened (n, to) range; returns 0. */
int coclr_max_pool3d(const float *restrict in, float *restrict out, int t, int h, int w, long c,
                     int kt, int kh, int kw, int st, int sh, int sw, int pt, int ph, int pw,
                     int to, int ho, int wo, long first, long last) {
    for (long plane = first; plane < last; plane++) {
        long b = plane / to;
        int ot = (int)(plane % to);
        for (int oh = 0; oh < ho; oh++) {
            for (int ow = 0; ow < wo; ow++) {
                float *acc = out + ((plane * ho + oh) * (long)wo + ow) * c;
                for (long i = 0; i < c; i++) acc[i] = -INFINITY;
                for (int dt = 0; dt < kt; dt++) {
                    int it = ot * st - pt + dt;
                    if (it < 0 || it >= t) continue;
                    for (int dh = 0; dh < kh; dh++) {
                        int ih = oh * sh - ph + dh;
                        if (ih < 0 || ih >= h) continue;
                        for (int dw = 0; dw < kw; dw++) {
                            int iw = ow * sw - pw + dw;
                            if (iw < 0 || iw >= w) continue;
                            channel_max(acc, in + (((b * t + it) * (long)h + ih) * w + iw) * c, c);
                        }
                    }
                }
            }
        }
    }
    return 0;
}
