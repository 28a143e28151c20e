/* Decode one region of a JPEG at one of libjpeg-turbo's DCT scales (1/1, 1/2, 1/4, 1/8), called
 * through ctypes by decode/jpeg/region.py, built by `make install`. Why our own C, its exactness
 * (a margin, below) and its rule for damaged data (any warning an error): docs/ffcv-and-decode.md
 * ("Crop and scale in one decode").
 * Glue around libjpeg-turbo's partial decompression (>= 1.5): scale_denom runs the IDCT on
 * 4x4/2x2/1x1 coefficients, jpeg_crop_scanline() and jpeg_skip_scanlines() limit the work to the
 * region's iMCU columns and rows, and decoding stops after its last row.
 */
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

struct err_mgr { struct jpeg_error_mgr pub; jmp_buf jump; int code; };

static void on_error(j_common_ptr cinfo) {
    struct err_mgr *err = (struct err_mgr *)cinfo->err;
    err->code = -1;
    longjmp(err->jump, 1);
}

/* Level -1, a warning about corrupt data (premature end, bad Huffman code, ...): printed as libjpeg
   prints it ("Corrupt JPEG data: ..." on stderr, which decode/messages.py catches), then stop. */
static void on_emit(j_common_ptr cinfo, int level) {
    struct err_mgr *err = (struct err_mgr *)cinfo->err;
    if (level < 0) {
        (*cinfo->err->output_message)(cinfo);
        err->code = -3;
        longjmp(err->jump, 1);
    }
}

/* ABI version, checked by decode/jpeg/region.py so that a stale build is never called. */
int jc_version(void) { return 4; }

/* Rows [y, y+h) and columns [x, x+w) of the image decoded at 1/denom (its size there is
   ceil(width/denom) x ceil(height/denom)) as RGB into out: h rows of w * 3 bytes. Returns 0;
   -1 on a libjpeg error, -2 if the region is outside the scaled image or denom is not 1, 2, 4
   or 8, -3 on a warning about corrupt data, -4 if out of memory. */
int jc_decode(const uint8_t *data, unsigned long size, int denom, int x, int y, int w, int h,
              uint8_t *out) {
    struct jpeg_decompress_struct cinfo;
    struct err_mgr err;
    JSAMPROW volatile row = NULL;  /* volatile: still valid after longjmp */
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_emit;
    err.code = 0;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        return err.code;
    }
    jpeg_mem_src(&cinfo, data, size);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)denom;
    jpeg_calc_output_dimensions(&cinfo);
    int width = (int)cinfo.output_width;
    if ((denom != 1 && denom != 2 && denom != 4 && denom != 8) || x < 0 || y < 0 || w < 1 ||
        h < 1 || x + w > width || y + h > (int)cinfo.output_height) {
        jpeg_destroy_decompress(&cinfo);
        return -2;
    }
    /* fancy upsampling reads one chroma sample either side: max_h_samp_factor pixels at most */
    int margin_x = 2 * cinfo.max_h_samp_factor;
    int x0 = x > margin_x ? x - margin_x : 0;
    int x1 = x + w + margin_x < width ? x + w + margin_x : width;
    jpeg_start_decompress(&cinfo);
    JDIMENSION crop_x = (JDIMENSION)x0, crop_w = (JDIMENSION)(x1 - x0);
    if (crop_x > 0 || crop_w < cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &crop_x, &crop_w);  /* crop_x moves left to an iMCU edge */
    row = (JSAMPROW)malloc((size_t)crop_w * 3);
    if (row == NULL) {
        jpeg_destroy_decompress(&cinfo);
        return -4;
    }
    if (y > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
    size_t offset = (size_t)(x - (int)crop_x) * 3, row_bytes = (size_t)w * 3;
    for (int r = 0; r < h; r++) {
        JSAMPROW target = row;
        if (jpeg_read_scanlines(&cinfo, &target, 1) != 1) {
            err.code = -1;
            longjmp(err.jump, 1);
        }
        memcpy(out + (size_t)r * row_bytes, row + offset, row_bytes);
    }
    jpeg_abort_decompress(&cinfo);  /* the rows below are never decoded */
    jpeg_destroy_decompress(&cinfo);
    free(row);
    return 0;
}
