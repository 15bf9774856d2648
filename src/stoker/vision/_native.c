/* stoker.vision._native: the fused path's two C kernels, decode and normalise.
 *
 * The module is optional: stoker builds it where a C compiler and libjpeg-turbo's headers
 * are present (setup.py), and decodes with simplejpeg or Pillow and normalises with NumPy
 * or torch where it is not.
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
 * normalize: ToTensor + Normalize of an H x W x 3 uint8 image, flipped or not, into a
 * 3 x H x W float32 array, in one pass: v * scale[c] - offset[c], each step rounded to
 * float32 as NumPy's multiply and subtract round it (no fused multiply-add), so the values
 * are NumPy's bit for bit. 16 pixels at a time with SSE4.1 where the CPU has it, else (and
 * for each row's last pixels) through a table of the 256 values per channel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

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

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {"normalize", normalize, METH_VARARGS, normalize_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "The fused path's C kernels: decode a JPEG's rectangle, normalise (see the C source).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__native(void) {
#ifdef HAVE_SIMD_ROWS
    make_masks();
    __builtin_cpu_init();
    have_sse41 = __builtin_cpu_supports("sse4.1");
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION",
                                             LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
