/* libFuzzer target: the safetensors header (length prefix + JSON index of
 * tensors) of an untrusted checkpoint file. */
#include "fuzz_util.h"
#include "hf_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    if (!fuzz_write_file("model.safetensors", data, size, path, sizeof path)) return 0;
    mt_st_file_t f;
    memset(&f, 0, sizeof f);
    if (mt_st_read_header(path, &f) == MT_OK) mt_st_file_free(&f);
    return 0;
}
