/* stoker.vision._native: the fused path's C kernels: decode, resample, normalise.
 *
 * The module is optional: stoker builds it where a C compiler is (setup.py), and decodes
 * with simplejpeg or Pillow and normalises with NumPy or torch where it is not, and
 * resamples with torch or Pillow. decode alone needs libjpeg-turbo: built with
 * STOKER_NO_JPEG defined (setup.py does so where libjpeg-turbo's headers are missing), the
 * module has resample and normalize but no decode and no LIBJPEG_TURBO_VERSION, and
 * stoker decodes as without the module. STOKER_JPEG_STATIC says that libjpeg-turbo is
 * linked into this file (a wheel: tools/build_wheel.sh), not loaded from the system;
 * JPEG_LINKAGE reports which.
 *
 * decode: only a rectangle of a JPEG. A random crop needs a rectangle of the image, and
 * libjpeg-turbo can skip the inverse DCT, upsampling and colour conversion of the rows
 * above it (jpeg_skip_scanlines: their entropy-coded data is still read, as it must be),
 * restrict them to the rectangle's columns (jpeg_crop_scanline, widened to whole iMCUs),
 * and stop below it. No Python binding on PyPI exposes either call. The pixels are those
 * of a full decode with the same settings, cut to the rectangle. Only plain chroma
 * upsampling is offered (fancy upsampling blends the rectangle's edge rows with rows it
 * does not decode), with the fast or the accurate integer IDCT.
 *
 * resample: Pillow's antialiased resize of a uint8 image, byte for byte (see below).
 *
 * normalize: ToTensor + Normalize of an H x W x 3 uint8 image, flipped or not, into a
 * 3 x H x W float32 array, in one pass: v * scale[c] - offset[c], each step rounded to
 * float32 as NumPy's multiply and subtract round it (no fused multiply-add), so the values
 * are NumPy's bit for bit. 16 pixels at a time with SSE4.1 where the CPU has it, else (and
 * for each row's last pixels) through a table of the 256 values per channel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef STOKER_NO_JPEG
#include <jpeglib.h>

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#error "stoker.vision._native needs libjpeg-turbo (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

#define ROWS_PER_READ 16

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int strict;
    char message[JMSG_LENGTH_MAX];
} ErrorManager;

static void on_error(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Warnings (level -1: corrupt or truncated data that libjpeg recovered from) are errors in
 * strict mode and ignored otherwise, as Pillow ignores them; trace messages always are. */
static void on_message(j_common_ptr cinfo, int level) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    if (level < 0 && err->strict) {
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }
}

PyDoc_STRVAR(decode_doc,
"decode(data, out, divisor, top, left, bottom, right, fast, strict) -> (rows, cols)\n\n"
"Decode the rectangle [top, bottom) x [left, right) of the JPEG `data`, in pixels of the\n"
"image at 1/`divisor` scale (1, 2, 4 or 8), as RGB into the writable buffer `out`:\n"
"rows x cols x 3 bytes, C-contiguous. `fast` takes the fast integer IDCT, else the\n"
"accurate one; `strict` turns libjpeg's warnings (corrupt or truncated data) into\n"
"errors. Raises ValueError for a rectangle outside the scaled image or a buffer too\n"
"small, OSError when libjpeg fails.");

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    int divisor, top, left, bottom, right, fast, strict;
    if (!PyArg_ParseTuple(args, "y*w*iiiiipp", &data, &out, &divisor, &top, &left, &bottom,
                          &right, &fast, &strict))
        return NULL;

    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.strict = strict;
    err.message[0] = '\0';
    const char *volatile invalid = NULL; /* a ValueError found after the header was read */
    volatile unsigned int height = 0, width_all = 0; /* of the scaled image, for messages */
    volatile int failed = 0;
    int rows = bottom - top, cols = right - left;

    Py_BEGIN_ALLOW_THREADS
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        failed = 1;
    } else {
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_RGB;
        cinfo.scale_num = 1;
        cinfo.scale_denom = (unsigned int)divisor;
        cinfo.dct_method = fast ? JDCT_IFAST : JDCT_ISLOW;
        cinfo.do_fancy_upsampling = FALSE;
        jpeg_calc_output_dimensions(&cinfo);
        height = cinfo.output_height;
        width_all = cinfo.output_width;
        if (divisor != 1 && divisor != 2 && divisor != 4 && divisor != 8)
            invalid = "divisor must be 1, 2, 4 or 8";
        else if (top < 0 || left < 0 || rows <= 0 || cols <= 0 ||
                 (JDIMENSION)bottom > cinfo.output_height ||
                 (JDIMENSION)right > cinfo.output_width)
            invalid = "the rectangle must lie inside the scaled image and not be empty";
        else if (out.len < (Py_ssize_t)rows * cols * 3)
            invalid = "out is smaller than rows x cols x 3 bytes";
        if (invalid == NULL) {
            jpeg_start_decompress(&cinfo);
            JDIMENSION x = (JDIMENSION)left, width = (JDIMENSION)cols;
            if (width < cinfo.output_width)
                jpeg_crop_scanline(&cinfo, &x, &width); /* widened to whole iMCUs */
            size_t skip = (size_t)(left - (int)x) * 3, stride = (size_t)cols * 3;
            if (top > 0)
                jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
            unsigned char *dst = (unsigned char *)out.buf;
            JSAMPARRAY tmp = NULL;
            if (width != (JDIMENSION)cols) /* rows come wider than the rectangle */
                tmp = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE,
                                                 width * 3, ROWS_PER_READ);
            JSAMPROW direct[ROWS_PER_READ];
            while (cinfo.output_scanline < (JDIMENSION)bottom) {
                JDIMENSION want = (JDIMENSION)bottom - cinfo.output_scanline;
                if (want > ROWS_PER_READ)
                    want = ROWS_PER_READ;
                size_t row0 = cinfo.output_scanline - (JDIMENSION)top;
                JSAMPARRAY target = tmp;
                if (tmp == NULL) {
                    for (JDIMENSION i = 0; i < want; i++)
                        direct[i] = dst + (row0 + i) * stride;
                    target = direct;
                }
                JDIMENSION got = jpeg_read_scanlines(&cinfo, target, want);
                if (tmp != NULL)
                    for (JDIMENSION i = 0; i < got; i++)
                        memcpy(dst + (row0 + i) * stride, tmp[i] + skip, stride);
                if (got == 0)
                    break; /* suspended: cannot happen with an in-memory source */
            }
        }
    }
    jpeg_destroy_decompress(&cinfo); /* also ends a decompression stopped above the end */
    Py_END_ALLOW_THREADS

    Py_ssize_t out_len = out.len;
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (failed) {
        PyErr_Format(PyExc_OSError, "libjpeg: %s", err.message);
        return NULL;
    }
    if (invalid != NULL) {
        PyErr_Format(PyExc_ValueError,
                     "%s: got divisor %d, rows [%d, %d), columns [%d, %d) of a %u x %u "
                     "image, %zd bytes of out",
                     invalid, divisor, top, bottom, left, right, height, width_all,
                     out_len);
        return NULL;
    }
    return Py_BuildValue("ii", rows, cols);
}
#endif /* STOKER_NO_JPEG */

/* One output row of each plane from one source row, through the per-channel tables of the
 * 256 possible values; `step` is +3 or -3 (a horizontal flip reads the row from its end). */
static void normalize_row(const unsigned char *restrict src, int step, Py_ssize_t width,
                          float *restrict r, float *restrict g, float *restrict b,
                          const float (*restrict table)[256]) {
    for (Py_ssize_t x = 0; x < width; x++, src += step) {
        r[x] = table[0][src[0]];
        g[x] = table[1][src[1]];
        b[x] = table[2][src[2]];
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <smmintrin.h>
#define HAVE_SIMD_ROWS 1
static int have_sse41; /* set at import: whether this CPU runs simd_rows */

/* pshufb masks that gather channel c of 16 interleaved pixels (48 bytes in three
 * registers) from register k: MASKS[flip][c][k], lanes in pixel order or reversed. */
static unsigned char MASKS[2][3][3][16];

static void make_masks(void) {
    for (int flip = 0; flip < 2; flip++)
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < 16; i++) {
                int byte = 3 * (flip ? 15 - i : i) + c;
                for (int k = 0; k < 3; k++)
                    MASKS[flip][c][k][i] = byte / 16 == k ? (unsigned char)(byte % 16) : 0x80;
            }
}

/* The leading multiple of 16 pixels of normalize_row, 16 at a time with SSE4.1: the same
 * float32 multiply, then subtract, so the same values as the tables. Returns how many
 * pixels it wrote. `row` is the row's start; with `flip` it is read from its end. */
__attribute__((target("sse4.1"))) static Py_ssize_t simd_rows(
    const unsigned char *restrict row, int flip, Py_ssize_t width, float *restrict planes[3],
    const float *scale, const float *offset) {
    Py_ssize_t x = 0;
    for (; x + 16 <= width; x += 16) {
        const unsigned char *p = row + 3 * (flip ? width - 16 - x : x);
        __m128i v[3] = {_mm_loadu_si128((const __m128i *)p),
                        _mm_loadu_si128((const __m128i *)(p + 16)),
                        _mm_loadu_si128((const __m128i *)(p + 32))};
        for (int c = 0; c < 3; c++) {
            const unsigned char(*m)[16] = MASKS[flip][c];
            __m128i bytes = _mm_or_si128(
                _mm_or_si128(_mm_shuffle_epi8(v[0], _mm_loadu_si128((const __m128i *)m[0])),
                             _mm_shuffle_epi8(v[1], _mm_loadu_si128((const __m128i *)m[1]))),
                _mm_shuffle_epi8(v[2], _mm_loadu_si128((const __m128i *)m[2])));
            __m128 s = _mm_set1_ps(scale[c]), o = _mm_set1_ps(offset[c]);
            __m128i quarter[4] = {bytes, _mm_srli_si128(bytes, 4), _mm_srli_si128(bytes, 8),
                                  _mm_srli_si128(bytes, 12)};
            for (int q = 0; q < 4; q++) {
                __m128 f = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(quarter[q]));
                _mm_storeu_ps(planes[c] + x + 4 * q, _mm_sub_ps(_mm_mul_ps(f, s), o));
            }
        }
    }
    return x;
}
#endif

PyDoc_STRVAR(normalize_doc,
"normalize(src, out, hflip, vflip, scale, offset)\n\n"
"Write out[c, y, x] = src[y', x', c] * scale[c] - offset[c] for the H x W x 3 uint8 `src`\n"
"(rows of contiguous pixels, any positive row stride) into the C-contiguous 3 x H x W\n"
"float32 buffer `out`, where y' and x' read `src` flipped as asked. `scale` and `offset`\n"
"are 3 floats each. Raises ValueError for other layouts or sizes.");

static PyObject *normalize(PyObject *self, PyObject *args) {
    PyObject *src_obj;
    Py_buffer src, out;
    int hflip, vflip;
    float scale[3], offset[3];
    if (!PyArg_ParseTuple(args, "Ow*pp(fff)(fff)", &src_obj, &out, &hflip, &vflip, &scale[0],
                          &scale[1], &scale[2], &offset[0], &offset[1], &offset[2]))
        return NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    int ok = src.ndim == 3 && src.itemsize == 1 && src.format != NULL &&
             strcmp(src.format, "B") == 0 && src.shape[2] == 3 && src.strides[2] == 1 &&
             src.strides[1] == 3 && src.strides[0] >= 3 * src.shape[1];
    Py_ssize_t height = ok ? src.shape[0] : 0, width = ok ? src.shape[1] : 0;
    if (!ok || out.len != 12 * height * width) {
        PyErr_Format(PyExc_ValueError,
                     "normalize needs an H x W x 3 uint8 source whose rows are contiguous "
                     "pixels (positive row stride) and a 3 x H x W float32 output; got %zd "
                     "source dimensions and %zd output bytes",
                     (Py_ssize_t)src.ndim, out.len);
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    float table[3][256];
    for (int c = 0; c < 3; c++) {
        volatile float product; /* rounded to float32 before the subtraction, as in NumPy */
        for (int v = 0; v < 256; v++) {
            product = (float)v * scale[c];
            table[c][v] = product - offset[c];
        }
    }
    const unsigned char *base = (const unsigned char *)src.buf;
    float *dst = (float *)out.buf;
    size_t plane = (size_t)height * (size_t)width;
    for (Py_ssize_t y = 0; y < height; y++) {
        const unsigned char *row = base + (vflip ? height - 1 - y : y) * src.strides[0];
        float *r = dst + (size_t)y * (size_t)width;
        float *planes[3] = {r, r + plane, r + 2 * plane};
        Py_ssize_t done = 0;
#ifdef HAVE_SIMD_ROWS
        if (have_sse41)
            done = simd_rows(row, hflip, width, planes, scale, offset);
#endif
        /* the rest of the row: from pixel `done`, or (flipped) towards the row's start */
        normalize_row(hflip ? row + 3 * (width - 1 - done) : row + 3 * done, hflip ? -3 : 3,
                      width - done, r + done, planes[1] + done, planes[2] + done,
                      (const float (*)[256])table);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* ---- resample: Pillow's ImagingResample on uint8, bit for bit -------------------------
 *
 * The antialiased filters of Pillow's Image.resize (box, bilinear, hamming, bicubic,
 * lanczos) on an H x W x C uint8 image (C = 1 or 3) and a float box of it: per output pixel
 * a table of weights (float64, normalised to sum 1, then rounded to 22-bit fixed point),
 * then two passes, each rounded to uint8 as Pillow rounds (1 << 21 added, shifted right by
 * 22, clamped): horizontal then vertical, or (Pillow 13, when the height shrinks by more
 * than twice what the width does) vertical then horizontal, each over only the rows or
 * columns the other reads. So the output is Pillow's byte for byte, and within 1 of
 * torch's antialiased kernels (which round their weights to 16 bits).
 *
 * The vertical pass (`convolve_rows`): output row i is the weighted sum of consecutive
 * input rows, across the whole row at once, 32 bytes at a time with AVX2. The horizontal
 * pass (`horizontal3_avx2`): two rows at once, four taps per load, 16-bit multiply-adds on
 * split weights. The instruction set is chosen at import (AVX2 where the CPU has it); the
 * plain C kernels do the rest (greyscale's horizontal pass, rows' ends, other CPUs). */

#define PRECISION_BITS 22

typedef struct {
    double (*weight)(double);
    double support;
} Filter;

static double box_filter(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }

static double bilinear_filter(double x) {
    x = x < 0.0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double hamming_filter(double x) {
    x = x < 0.0 ? -x : x;
    if (x == 0.0)
        return 1.0;
    if (x >= 1.0)
        return 0.0;
    x = x * M_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x)); /* float constants, as in Pillow */
}

static double bicubic_filter(double x) {
    const double a = -0.5;
    x = x < 0.0 ? -x : x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0)
        return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc(double x) {
    if (x == 0.0)
        return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos_filter(double x) {
    return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0;
}

/* indexed by Pillow's filter numbers: LANCZOS 1, BILINEAR 2, BICUBIC 3, BOX 4, HAMMING 5 */
static const Filter FILTERS[6] = {
    {NULL, 0.0},           {lanczos_filter, 3.0}, {bilinear_filter, 1.0},
    {bicubic_filter, 2.0}, {box_filter, 0.5},     {hamming_filter, 1.0},
};

/* Taps per output pixel for `out` pixels from [in0, in1): Pillow's ksize. */
static int taps(const Filter *f, float in0, float in1, int out) {
    double scale = (double)(in1 - in0) / out;
    return (int)ceil(f->support * (scale < 1.0 ? 1.0 : scale)) * 2 + 1;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc: for each output pixel, its first
 * input pixel and count in bounds[2 i], bounds[2 i + 1], and `ksize` fixed-point weights in
 * kk (zero past the count). `w` is scratch for ksize doubles. */
static void coefficients(const Filter *f, int in_size, float in0, float in1, int out,
                         int ksize, int *bounds, int32_t *kk, double *w) {
    double scale = (double)(in1 - in0) / out, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = f->support * filterscale, ss = 1.0 / filterscale;
    for (int xx = 0; xx < out; xx++) {
        double center = in0 + (xx + 0.5) * scale, ww = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            w[x] = f->weight((x + xmin - center + 0.5) * ss);
            ww += w[x];
        }
        int32_t *k = kk + (size_t)xx * ksize;
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax ? (ww != 0.0 ? w[x] / ww : w[x]) : 0.0;
            k[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PRECISION_BITS)
                                   : 0.5 + v * (1 << PRECISION_BITS));
        }
        bounds[2 * xx] = xmin;
        bounds[2 * xx + 1] = xmax;
    }
}

static inline unsigned char clip8(int32_t v) {
    v >>= PRECISION_BITS;
    return (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Bytes [from, n) of each output row, in plain C: a block of the row at a time, tap by
 * tap into int32 sums (loops the compiler vectorises for the baseline instruction set). */
static void convolve_scalar(const unsigned char *src, ptrdiff_t src_stride, unsigned char *dst,
                            ptrdiff_t dst_stride, size_t from, size_t n, int rows,
                            const int *bounds, const int32_t *kk, int ksize) {
    enum { BLOCK = 512 };
    int32_t acc[BLOCK];
    for (int i = 0; i < rows; i++) {
        const unsigned char *first = src + (ptrdiff_t)bounds[2 * i] * src_stride;
        const int32_t *k = kk + (size_t)i * ksize;
        unsigned char *out = dst + (ptrdiff_t)i * dst_stride;
        for (size_t j0 = from; j0 < n; j0 += BLOCK) {
            size_t len = n - j0 < BLOCK ? n - j0 : BLOCK;
            for (size_t j = 0; j < len; j++)
                acc[j] = 1 << (PRECISION_BITS - 1);
            for (int t = 0; t < bounds[2 * i + 1]; t++) {
                const unsigned char *row = first + t * src_stride + (ptrdiff_t)j0;
                int32_t w = k[t];
                for (size_t j = 0; j < len; j++)
                    acc[j] += row[j] * w;
            }
            for (size_t j = 0; j < len; j++)
                out[j0 + j] = clip8(acc[j]);
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_AVX2_ROWS 1
static int have_avx2; /* set at import: whether this CPU runs convolve_avx2 */

/* The leading multiple of 32 bytes of each output row (returned), 32 at a time: four
 * accumulators of 8 int32 lanes, one 32-bit multiply per tap and lane (Pillow's weights
 * need all 22 bits, so no 16-bit multiply-add), packed back with saturation = clip8. */
__attribute__((target("avx2"))) static size_t convolve_avx2(
    const unsigned char *src, ptrdiff_t src_stride, unsigned char *dst, ptrdiff_t dst_stride,
    size_t n, int rows, const int *bounds, const int32_t *kk, int ksize) {
    size_t whole = n - n % 32;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    for (int i = 0; i < rows; i++) {
        const unsigned char *first = src + (ptrdiff_t)bounds[2 * i] * src_stride;
        const int32_t *k = kk + (size_t)i * ksize;
        int count = bounds[2 * i + 1];
        unsigned char *out = dst + (ptrdiff_t)i * dst_stride;
        for (size_t j = 0; j < whole; j += 32) {
            __m256i a0 = half, a1 = half, a2 = half, a3 = half;
            const unsigned char *p = first + j;
            for (int t = 0; t < count; t++, p += src_stride) {
                __m256i w = _mm256_set1_epi32(k[t]);
                __m256i v = _mm256_loadu_si256((const __m256i *)p);
                __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(lo), w));
                a1 = _mm256_add_epi32(
                    a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), w));
                a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(hi), w));
                a3 = _mm256_add_epi32(
                    a3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), w));
            }
            __m256i p01 = _mm256_packs_epi32(_mm256_srai_epi32(a0, PRECISION_BITS),
                                             _mm256_srai_epi32(a1, PRECISION_BITS));
            __m256i p23 = _mm256_packs_epi32(_mm256_srai_epi32(a2, PRECISION_BITS),
                                             _mm256_srai_epi32(a3, PRECISION_BITS));
            __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), order);
            _mm256_storeu_si256((__m256i *)(out + j), bytes);
        }
    }
    return whole;
}
#endif

/* dst row i (n bytes) = clip8 of the weighted sum of src rows bounds[2 i] ... */
static void convolve_rows(const unsigned char *src, ptrdiff_t src_stride, unsigned char *dst,
                          ptrdiff_t dst_stride, size_t n, int rows, const int *bounds,
                          const int32_t *kk, int ksize, int portable) {
    size_t done = 0;
#ifdef HAVE_AVX2_ROWS
    if (have_avx2 && !portable)
        done = convolve_avx2(src, src_stride, dst, dst_stride, n, rows, bounds, kk, ksize);
#endif
    if (done < n)
        convolve_scalar(src, src_stride, dst, dst_stride, done, n, rows, bounds, kk, ksize);
}

/* The horizontal pass in plain C, as Pillow computes it: `rows` rows of `src`, each output
 * pixel the weighted sum of `bounds[2 i + 1]` pixels from bounds[2 i] on, per channel. */
static void horizontal_scalar(const unsigned char *src, ptrdiff_t src_stride, int rows, int c,
                              unsigned char *dst, ptrdiff_t dst_stride, int ow,
                              const int *bounds, const int32_t *kk, int ksize) {
    for (int y = 0; y < rows; y++) {
        const unsigned char *row = src + (ptrdiff_t)y * src_stride;
        unsigned char *out = dst + (ptrdiff_t)y * dst_stride;
        for (int xx = 0; xx < ow; xx++) {
            const unsigned char *p = row + (ptrdiff_t)bounds[2 * xx] * c;
            const int32_t *k = kk + (size_t)xx * ksize;
            int32_t r = 1 << (PRECISION_BITS - 1), g = r, b = r;
            if (c == 3) {
                for (int t = 0; t < bounds[2 * xx + 1]; t++, p += 3) {
                    r += p[0] * k[t];
                    g += p[1] * k[t];
                    b += p[2] * k[t];
                }
                out[3 * xx] = clip8(r);
                out[3 * xx + 1] = clip8(g);
                out[3 * xx + 2] = clip8(b);
            } else {
                for (int t = 0; t < bounds[2 * xx + 1]; t++)
                    r += p[t] * k[t];
                out[xx] = clip8(r);
            }
        }
    }
}

#ifdef HAVE_AVX2_ROWS
/* Output pixel `xx` of two rows (`r0` in the low 128-bit lane, `r1` in the high one) into
 * `d0` and `d1`: four taps per 16-byte load, shuffled into 16-bit (pixel, next pixel) pairs
 * per channel and multiplied-and-added in pairs (pmaddwd), on the split weights `h`, `l`
 * (k = 2048 h + l, 0 <= l < 2048: Pillow's 22-bit weights do not fit 16 bits), the two
 * sums joined exactly. `last` says this is the row's last pixel: only 3 bytes are stored
 * (else 4, the fourth overwritten by the next pixel). */
__attribute__((target("avx2"))) static inline void pixel_pair(
    const unsigned char *r0, const unsigned char *r1, unsigned char *d0, unsigned char *d1,
    int count, const int16_t *h, const int16_t *l, int last) {
    const __m256i lo = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1,
                                        -1, 0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1,
                                        -1, -1);
    const __m256i hi = _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1,
                                        -1, -1, 6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1,
                                        -1, -1, -1);
    __m256i sh = _mm256_setzero_si256(), sl = _mm256_setzero_si256();
    for (int t = 0; t < count; t += 4) {
        __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(r0 + 3 * t))),
            _mm_loadu_si128((const __m128i *)(r1 + 3 * t)), 1);
        __m256i a = _mm256_shuffle_epi8(v, lo), b = _mm256_shuffle_epi8(v, hi);
        int32_t h01, h23, l01, l23;
        memcpy(&h01, h + t, 4);
        memcpy(&h23, h + t + 2, 4);
        memcpy(&l01, l + t, 4);
        memcpy(&l23, l + t + 2, 4);
        sh = _mm256_add_epi32(sh, _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_set1_epi32(h01)),
                                                   _mm256_madd_epi16(b, _mm256_set1_epi32(h23))));
        sl = _mm256_add_epi32(sl, _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_set1_epi32(l01)),
                                                   _mm256_madd_epi16(b, _mm256_set1_epi32(l23))));
    }
    __m256i acc = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(sh, 11), sl),
                                   _mm256_set1_epi32(1 << (PRECISION_BITS - 1)));
    acc = _mm256_srai_epi32(acc, PRECISION_BITS);
    acc = _mm256_packus_epi16(_mm256_packs_epi32(acc, acc), acc);
    int32_t px0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(acc));
    int32_t px1 = _mm_cvtsi128_si32(_mm256_extracti128_si256(acc, 1));
    if (last) {
        memcpy(d0, &px0, 3);
        memcpy(d1, &px1, 3);
    } else { /* one 4-byte store each, where a 3-byte one would be two stores */
        memcpy(d0, &px0, 4);
        memcpy(d1, &px1, 4);
    }
}

/* The horizontal pass of an RGB image with AVX2, two rows at a time (see pixel_pair): the
 * result is Pillow's. A load never reads past `src_len` bytes from `src` (such pixels take
 * the plain C path). Returns 0, having done nothing, without memory. */
__attribute__((target("avx2"))) static int horizontal3_avx2(
    const unsigned char *src, ptrdiff_t src_stride, size_t src_len, int rows,
    unsigned char *dst, ptrdiff_t dst_stride, int ow, const int *bounds, const int32_t *kk,
    int ksize) {
    int k4 = (ksize + 3) / 4 * 4; /* taps per pixel, padded with zero weights */
    int16_t *kh = malloc(sizeof(int16_t) * 2 * (size_t)ow * k4), *kl = kh + (size_t)ow * k4;
    if (kh == NULL)
        return 0;
    size_t reach = 0; /* how far past a row's start the loads of its pixels read */
    for (int xx = 0; xx < ow; xx++) {
        for (int t = 0; t < k4; t++) {
            int32_t k = t < ksize ? kk[(size_t)xx * ksize + t] : 0;
            kh[(size_t)xx * k4 + t] = (int16_t)(k >> 11);
            kl[(size_t)xx * k4 + t] = (int16_t)(k & 2047);
        }
        size_t r = (size_t)(bounds[2 * xx] + (bounds[2 * xx + 1] - 1) / 4 * 4) * 3 + 16;
        reach = r > reach ? r : reach;
    }
    for (int y = 0; y < rows; y += 2) {
        int y1 = y + 1 < rows ? y + 1 : y; /* an odd last row pairs with itself */
        const unsigned char *r0 = src + (ptrdiff_t)y * src_stride;
        const unsigned char *r1 = src + (ptrdiff_t)y1 * src_stride;
        size_t room = src_len - (size_t)((ptrdiff_t)y1 * src_stride); /* readable from r1 */
        unsigned char *d0 = dst + (ptrdiff_t)y * dst_stride, *d1 = dst + (ptrdiff_t)y1 * dst_stride;
        if (room >= reach) { /* every row but the last few */
            int xx = 0;
            for (; xx < ow - 1; xx++) {
                const unsigned char *p = r0 + 3 * bounds[2 * xx];
                pixel_pair(p, p + (r1 - r0), d0 + 3 * xx, d1 + 3 * xx, bounds[2 * xx + 1],
                           kh + (size_t)xx * k4, kl + (size_t)xx * k4, 0);
            }
            const unsigned char *p = r0 + 3 * bounds[2 * xx];
            pixel_pair(p, p + (r1 - r0), d0 + 3 * xx, d1 + 3 * xx, bounds[2 * xx + 1],
                       kh + (size_t)xx * k4, kl + (size_t)xx * k4, 1);
            continue;
        }
        for (int xx = 0; xx < ow; xx++) {
            int xmin = bounds[2 * xx], count = bounds[2 * xx + 1];
            if ((size_t)(xmin + (count - 1) / 4 * 4) * 3 + 16 > room) {
                /* this pixel of both rows: one row each, one output pixel */
                const int32_t *k = kk + (size_t)xx * ksize;
                horizontal_scalar(r0, 0, 1, 3, d0 + 3 * xx, 0, 1, bounds + 2 * xx, k, ksize);
                horizontal_scalar(r1, 0, 1, 3, d1 + 3 * xx, 0, 1, bounds + 2 * xx, k, ksize);
                continue;
            }
            pixel_pair(r0 + 3 * xmin, r1 + 3 * xmin, d0 + 3 * xx, d1 + 3 * xx, count,
                       kh + (size_t)xx * k4, kl + (size_t)xx * k4, 1);
        }
    }
    free(kh);
    return 1;
}
#endif

/* The horizontal pass: `rows` rows of `src` (`src_len` bytes readable from it) into `dst`. */
static void horizontal_pass(const unsigned char *src, ptrdiff_t src_stride, size_t src_len,
                            int rows, int c, unsigned char *dst, ptrdiff_t dst_stride, int ow,
                            const int *bounds, const int32_t *kk, int ksize, int portable) {
#ifdef HAVE_AVX2_ROWS
    if (c == 3 && have_avx2 && !portable &&
        horizontal3_avx2(src, src_stride, src_len, rows, dst, dst_stride, ow, bounds, kk,
                         ksize))
        return;
#endif
    horizontal_scalar(src, src_stride, rows, c, dst, dst_stride, ow, bounds, kk, ksize);
}

/* An image argument: rows of `width` pixels of `channels` contiguous bytes, `stride` apart. */
typedef struct {
    Py_buffer view;
    Py_ssize_t height, width, channels, stride;
} Pixels;

/* Fill `px` from `obj` (H x W or H x W x C uint8, C = 1 or 3); 0 with ValueError if not. */
static int get_pixels(PyObject *obj, Pixels *px, int writable, const char *what) {
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &px->view, flags) < 0)
        return 0;
    Py_buffer *v = &px->view;
    int ok = (v->ndim == 2 || v->ndim == 3) && v->itemsize == 1 && v->format != NULL &&
             strcmp(v->format, "B") == 0;
    if (ok) {
        px->height = v->shape[0];
        px->width = v->shape[1];
        px->channels = v->ndim == 3 ? v->shape[2] : 1;
        px->stride = v->strides[0];
        ok = (px->channels == 1 || px->channels == 3) && px->height > 0 && px->width > 0 &&
             (v->ndim == 2 || v->strides[2] == 1) && v->strides[1] == px->channels &&
             px->stride >= px->width * px->channels;
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError,
                     "resample needs %s as a non-empty H x W or H x W x C uint8 array (C = 1 "
                     "or 3) whose rows are contiguous pixels with a positive row stride; got "
                     "%d dimensions of format %s",
                     what, v->ndim, v->format != NULL ? v->format : "?");
        PyBuffer_Release(v);
    }
    return ok;
}

PyDoc_STRVAR(resample_doc,
"resample(src, out, box, filter, newer_order=True, portable=False)\n\n"
"Resize the box (x0, y0, x1, y1) (floats, pixels of `src`) of the uint8 image `src` into\n"
"the whole of `out`, as Pillow's Image.resize(out size, filter, box) does, byte for byte:\n"
"both are H x W or H x W x C uint8 with C = 1 or 3 (the same C), rows of contiguous\n"
"pixels with any positive row stride. `filter` is Pillow's number: 1 LANCZOS, 2 BILINEAR,\n"
"3 BICUBIC, 4 BOX, 5 HAMMING. `newer_order` orders the passes as Pillow 13 does (False:\n"
"as earlier versions). `portable` takes the plain C kernel even where AVX2 runs\n"
"(the same bytes; for tests). Releases the GIL. Raises ValueError for other layouts, a\n"
"box outside `src` or empty, or another filter.");

static PyObject *resample(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    float box[4];
    int filter, newer_order = 1, portable = 0;
    if (!PyArg_ParseTuple(args, "OO(ffff)i|pp", &src_obj, &out_obj, &box[0], &box[1], &box[2],
                          &box[3], &filter, &newer_order, &portable))
        return NULL;
    if (filter < 1 || filter > 5)
        return PyErr_Format(PyExc_ValueError,
                            "resample's filter must be 1 to 5 (Pillow's LANCZOS, BILINEAR, "
                            "BICUBIC, BOX, HAMMING); got %d",
                            filter);
    Pixels in, out;
    if (!get_pixels(src_obj, &in, 0, "src"))
        return NULL;
    if (!get_pixels(out_obj, &out, 1, "out")) {
        PyBuffer_Release(&in.view);
        return NULL;
    }
    const char *invalid = NULL;
    if (in.channels != out.channels)
        invalid = "src and out must have the same number of channels";
    else if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= in.width && box[3] <= in.height &&
               box[2] > box[0] && box[3] > box[1]))
        invalid = "the box must lie inside src and not be empty";
    else if (in.width > INT_MAX / 4 || in.height > INT_MAX / 4 || out.width > INT_MAX / 4 ||
             out.height > INT_MAX / 4)
        invalid = "the images are too large";
    if (invalid != NULL) {
        PyErr_Format(PyExc_ValueError,
                     "%s: got box (%g, %g, %g, %g) of a %zd x %zd x %zd src, out %zd x %zd x %zd",
                     invalid, box[0], box[1], box[2], box[3], in.height, in.width, in.channels,
                     out.height, out.width, out.channels);
        PyBuffer_Release(&in.view);
        PyBuffer_Release(&out.view);
        return NULL;
    }
    const Filter *f = &FILTERS[filter];
    int c = (int)in.channels, iw = (int)in.width, ih = (int)in.height;
    int ow = (int)out.width, oh = (int)out.height;
    int need_h = ow != iw || box[0] != 0 || box[2] != ow; /* as Pillow decides */
    int need_v = oh != ih || box[1] != 0 || box[3] != oh;
    int ks_h = taps(f, box[0], box[2], ow), ks_v = taps(f, box[1], box[3], oh);
    int failed = 0;

    Py_BEGIN_ALLOW_THREADS
    int ks_max = ks_h > ks_v ? ks_h : ks_v;
    int *bounds_h = malloc(sizeof(int) * 2 * (size_t)ow);
    int *bounds_v = malloc(sizeof(int) * 2 * (size_t)oh);
    int32_t *kk_h = malloc(sizeof(int32_t) * (size_t)ow * (size_t)ks_h);
    int32_t *kk_v = malloc(sizeof(int32_t) * (size_t)oh * (size_t)ks_v);
    double *w = malloc(sizeof(double) * (size_t)ks_max);
    unsigned char *scratch = NULL;
    if (!bounds_h || !bounds_v || !kk_h || !kk_v || !w) {
        failed = 1;
        goto done;
    }
    coefficients(f, ih, box[1], box[3], oh, ks_v, bounds_v, kk_v, w);
    coefficients(f, iw, box[0], box[2], ow, ks_h, bounds_h, kk_h, w);
    const unsigned char *src = (const unsigned char *)in.view.buf;
    unsigned char *dst = (unsigned char *)out.view.buf;
    /* The rows the vertical pass reads and the columns the horizontal pass reads. */
    int y0 = bounds_v[0], y1 = bounds_v[2 * oh - 2] + bounds_v[2 * oh - 1];
    int x0 = bounds_h[0], x1 = bounds_h[2 * ow - 2] + bounds_h[2 * ow - 1];
    for (int i = 0; i < ow; i++)
        bounds_h[2 * i] -= x0;
    /* Pillow 13 runs the vertical pass first when the height shrinks by more than twice
     * what the width does; earlier versions always ran the horizontal pass first. */
    int vertical_first = newer_order && ih > oh && (ih - oh) > (iw - ow) * 2;
    if (!need_h && !need_v) {
        for (int y = 0; y < oh; y++)
            memcpy(dst + (ptrdiff_t)y * out.stride, src + (ptrdiff_t)y * in.stride,
                   (size_t)ow * c);
        goto done;
    }
    if (!need_h) {
        convolve_rows(src, in.stride, dst, out.stride, (size_t)ow * c, oh, bounds_v, kk_v,
                      ks_v, portable);
        goto done;
    }
    /* the bytes readable from src's start, and from the first pixel the passes read */
    size_t src_len = (size_t)(ih - 1) * (size_t)in.stride + (size_t)iw * c;
    const unsigned char *corner = src + (ptrdiff_t)x0 * c;
    size_t mid_len = vertical_first ? (size_t)oh * (x1 - x0) * c : (size_t)(y1 - y0) * ow * c;
    if (!need_v) {
        horizontal_pass(corner, in.stride, src_len - (size_t)x0 * c, ih, c, dst, out.stride,
                        ow, bounds_h, kk_h, ks_h, portable);
        goto done;
    }
    scratch = malloc(mid_len);
    if (!scratch) {
        failed = 1;
        goto done;
    }
    if (vertical_first) { /* columns x0 .. x1 only: the others are never read */
        ptrdiff_t mid_stride = (ptrdiff_t)(x1 - x0) * c;
        convolve_rows(corner, in.stride, scratch, mid_stride, (size_t)mid_stride, oh, bounds_v,
                      kk_v, ks_v, portable);
        horizontal_pass(scratch, mid_stride, mid_len, oh, c, dst, out.stride, ow, bounds_h,
                        kk_h, ks_h, portable);
    } else { /* rows y0 .. y1 only */
        ptrdiff_t mid_stride = (ptrdiff_t)ow * c, skip = (ptrdiff_t)y0 * in.stride;
        horizontal_pass(corner + skip, in.stride, src_len - (size_t)x0 * c - (size_t)skip,
                        y1 - y0, c, scratch, mid_stride, ow, bounds_h, kk_h, ks_h, portable);
        for (int i = 0; i < oh; i++)
            bounds_v[2 * i] -= y0;
        convolve_rows(scratch, mid_stride, dst, out.stride, (size_t)mid_stride, oh, bounds_v,
                      kk_v, ks_v, portable);
    }
done:
    free(bounds_h);
    free(bounds_v);
    free(kk_h);
    free(kk_v);
    free(w);
    free(scratch);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&in.view);
    PyBuffer_Release(&out.view);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
#ifndef STOKER_NO_JPEG
    {"decode", decode, METH_VARARGS, decode_doc},
#endif
    {"normalize", normalize, METH_VARARGS, normalize_doc},
    {"resample", resample, METH_VARARGS, resample_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "The fused path's C kernels: decode a JPEG's rectangle, resample, normalise (see "
             "the C source).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__native(void) {
#ifdef HAVE_SIMD_ROWS
    make_masks();
    __builtin_cpu_init();
    have_sse41 = __builtin_cpu_supports("sse4.1");
#endif
#ifdef HAVE_AVX2_ROWS
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    PyObject *m = PyModule_Create(&module);
    const char *kernel = "c";
#ifdef HAVE_AVX2_ROWS
    if (have_avx2)
        kernel = "avx2";
#endif
    if (m == NULL)
        return NULL;
#ifndef STOKER_NO_JPEG
#ifdef STOKER_JPEG_STATIC
    const char *linkage = "static";
#else
    const char *linkage = "shared";
#endif
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER) < 0 ||
        PyModule_AddStringConstant(m, "JPEG_LINKAGE", linkage) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    if (PyModule_AddStringConstant(m, "RESAMPLE_KERNEL", kernel) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
