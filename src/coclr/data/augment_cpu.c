/* The first and last steps of the CPU augmentation: a clip's bilinear crops, and the 8-bit RGB clip to the
 * network's normalised float32 planes. Loaded by coclr/data/augment_cpu.py.
 *
 * Normalisation. rgb: [pixels, 3] interleaved bytes; out: three float32 planes, plane c at out + c * plane_stride;
 * out[c][i] = (float)rgb[i][c] * scale[c] + shift[c], the product and the sum each rounded to float32 (no FMA: the
 * build's -ffp-contract=off), so NumPy's float32 multiply and add give the same bits.
 */
#include <stdint.h>

/* Pixels [first, last); returns 0. */
int coclr_rgb_to_planes(const uint8_t *restrict rgb, float *restrict out, long plane_stride,
                        const float *restrict scale, const float *restrict shift, long first, long last) {
    float *restrict red = out, *restrict green = out + plane_stride, *restrict blue = out + 2 * plane_stride;
    const float s0 = scale[0], s1 = scale[1], s2 = scale[2], b0 = shift[0], b1 = shift[1], b2 = shift[2];
    for (long i = first; i < last; i++) {
        red[i] = (float)rgb[3 * i] * s0 + b0;
        green[i] = (float)rgb[3 * i + 1] * s1 + b1;
        blue[i] = (float)rgb[3 * i + 2] * s2 + b2;
    }
    return 0;
}

/* Crops. Bilinear samples of a clip's frames at separable sample positions, in fixed point (the first step of
 * the CPU augmentation). Positions are given per output column and row: the two source pixels each blends and
 * the weight of the second, in 1/COCLR_CROP_ONE (the first gets the rest). Each frame is interpolated along x on
 * the source rows the crop reads ([row_first, row_last]), then along y; the sums are exact integers, rounded
 * once (half up): out = (sum + ONE^2 / 2) / ONE^2, so any compiler and instruction set gives the same bytes.
 *
 * src: [frames, height, width, 3]; dst: [frames, out_h, out_w, 3]; work: (row_last - row_first + 1) * out_w * 3
 * int32. Returns 0.
 */
#define COCLR_CROP_BITS 11
#define COCLR_CROP_ONE (1 << COCLR_CROP_BITS)
#define COCLR_CROP_HALF (1 << (2 * COCLR_CROP_BITS - 1))

int coclr_crop_resize(const uint8_t *restrict src, long frames, int height, int width,
                      const int *restrict x_left, const int *restrict x_right, const int *restrict x_weight, int out_w,
                      const int *restrict y_top, const int *restrict y_bottom, const int *restrict y_weight, int out_h,
                      int row_first, int row_last, int *restrict work, uint8_t *restrict dst) {
    const long row_len = (long)out_w * 3;
    for (long f = 0; f < frames; f++) {
        const uint8_t *frame = src + f * height * (long)width * 3;
        for (int r = row_first; r <= row_last; r++) {
            const uint8_t *row = frame + (long)r * width * 3;
            int *out = work + (r - row_first) * row_len;
            for (int j = 0; j < out_w; j++) {
                const uint8_t *left = row + 3 * x_left[j], *right = row + 3 * x_right[j];
                const int b = x_weight[j], a = COCLR_CROP_ONE - b;
                out[3 * j] = left[0] * a + right[0] * b;
                out[3 * j + 1] = left[1] * a + right[1] * b;
                out[3 * j + 2] = left[2] * a + right[2] * b;
            }
        }
        uint8_t *frame_out = dst + f * out_h * row_len;
        for (int i = 0; i < out_h; i++) {
            const int *top = work + (y_top[i] - row_first) * row_len;
            const int *bottom = work + (y_bottom[i] - row_first) * row_len;
            const int b = y_weight[i], a = COCLR_CROP_ONE - b;
            uint8_t *out = frame_out + i * row_len;
            for (long k = 0; k < row_len; k++)  /* at most 255 * ONE^2 + ONE^2 / 2 < 2^31 */
                out[k] = (uint8_t)((top[k] * a + bottom[k] * b + COCLR_CROP_HALF) >> (2 * COCLR_CROP_BITS));
        }
    }
    return 0;
}
