/* fuzz_safetensors.c: a safetensors image as the fuzzer writes it; what parses must read
 * every tensor (as f32, where small) without a read outside the image. */
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "fuzz_common.h"
#include "safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy exactly as long as the input, so ASan sees any read past its end */
    unsigned char *img = malloc(size ? size : 1);
    memcpy(img, data, size);
    tp_st_file f = {0};
    if (tp_st_parse_buffer(img, size, "fuzz.safetensors", &f) == TP_OK) {
        for (size_t i = 0; i < f.n_tensors; i++) {
            const tp_st_tensor *x = &f.tensors[i];
            int64_t rows = x->rank ? x->shape[0] : 1, cols = 1;
            for (int d = 1; d < x->rank; d++) cols *= x->shape[d];
            if (rows * cols > 1 << 16) continue;
            float *out = malloc((size_t)(rows * cols > 0 ? rows * cols : 1) * sizeof *out);
            tp_st_read_slice(&f, x, (tp_slice){0, rows, 0, cols}, TP_DTYPE_F32, out);
            if (rows > 1 && cols > 1) /* an inner slice too */
                tp_st_read_slice(&f, x, (tp_slice){1, rows - 1, 1, cols - 1}, TP_DTYPE_F32, out);
            free(out);
            tp_error_clear();
        }
        if (f.n_tensors) tp_st_find(&f, f.tensors[f.n_tensors - 1].name);
    }
    tp_st_free(&f);
    free(img);
    tp_error_clear();
    return 0;
}
