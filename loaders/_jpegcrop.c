/* Decode only a window of a JPEG with libjpeg-turbo, for RandomResizedCrop.
 *
 * A training crop covers on average about half of the image, and the rows below it need not be
 * read at all: jpeg_crop_scanline() limits the inverse DCT, upsampling and colour conversion
 * to the iMCU columns around the window, jpeg_skip_scanlines() skips that work for the rows
 * above it (their entropy-coded data is still read, as JPEG requires), and decoding stops after
 * the window's last row (libjpeg-turbo >= 1.5, jpeglib.h "partial decompression").
 * Built by `make install` into loaders/_jpegcrop.so and called through ctypes by
 * loaders/_jpeg_window.py; without it the loaders decode whole images.
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <setjmp.h>
#include <jpeglib.h>

struct err_mgr { struct jpeg_error_mgr pub; jmp_buf jump; int warned; };
static void on_error(j_common_ptr cinfo) { longjmp(((struct err_mgr *)cinfo->err)->jump, 1); }
static void on_message(j_common_ptr cinfo) { (void)cinfo; }
/* Level -1 is a warning about corrupt data (e.g. premature end of file): libjpeg would fill the
   rest with grey; report it so that the caller decodes the whole file and sees the error. */
static void on_emit(j_common_ptr cinfo, int level) {
    if (level < 0) ((struct err_mgr *)cinfo->err)->warned = 1;
}

/* Header only: size and components. Returns 0 on success. */
int jc_header(const uint8_t *data, unsigned long size, int *width, int *height, int *components) {
    struct jpeg_decompress_struct cinfo; struct err_mgr err;
    cinfo.err = jpeg_std_error(&err.pub); err.pub.error_exit = on_error; err.pub.output_message = on_message;
    if (setjmp(err.jump)) { jpeg_destroy_decompress(&cinfo); return -1; }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, size);
    jpeg_read_header(&cinfo, TRUE);
    *width = cinfo.image_width; *height = cinfo.image_height; *components = cinfo.num_components;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* ABI version, checked by loaders/_jpeg_window.py so that a stale build is not called. */
int jc_version(void) { return 2; }

/* Decode rows [y, y+h) and columns [x, x+w) to RGB into out: h rows of exactly w * 3 bytes.
   out needs capacity >= h * (w + 64) * 3 bytes: libjpeg decodes whole iMCU columns (up to 32 px
   more on each side), and the rows are compacted in place afterwards. Returns 0 on success, -1
   on a libjpeg error, -2 if out is too small, -3 if libjpeg warned of corrupt data. */
int jc_decode_window(const uint8_t *data, unsigned long size, int x, int y, int w, int h,
                     uint8_t *out, unsigned long capacity) {
    struct jpeg_decompress_struct cinfo; struct err_mgr err;
    cinfo.err = jpeg_std_error(&err.pub); err.pub.error_exit = on_error; err.pub.output_message = on_message;
    err.pub.emit_message = on_emit; err.warned = 0;
    if (setjmp(err.jump)) { jpeg_destroy_decompress(&cinfo); return -1; }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, size);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    JDIMENSION cx = (JDIMENSION)x, cw = (JDIMENSION)w;
    jpeg_crop_scanline(&cinfo, &cx, &cw);
    if ((unsigned long)cw * 3 * h > capacity) { jpeg_destroy_decompress(&cinfo); return -2; }
    if (y > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
    for (int row = 0; row < h; row++) {
        JSAMPROW ptr = out + (unsigned long)row * cw * 3;
        if (jpeg_read_scanlines(&cinfo, &ptr, 1) != 1) { jpeg_destroy_decompress(&cinfo); return -1; }
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    /* Keep columns [x, x+w) of each row, rows back to back (destination never after source). */
    unsigned long offset = (unsigned long)(x - (int)cx) * 3, row_bytes = (unsigned long)w * 3;
    for (int row = 0; row < h; row++)
        memmove(out + row * row_bytes, out + row * (unsigned long)cw * 3 + offset, row_bytes);
    return err.warned ? -3 : 0;
}
