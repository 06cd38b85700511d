/* libFuzzer target: an llm.c token file (header + uint16 tokens), opened,
 * validated and read back. */
#include "fuzz_util.h"
#include "mt_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    if (!fuzz_write_file("train.bin", data, size, path, sizeof path)) return 0;
    mt_dataset_t ds;
    memset(&ds, 0, sizeof ds);
    if (mt_dataset_open(&ds, path, MT_DATA_LLMC, 50257) != MT_OK) return 0;
    int32_t out[16];
    int64_t n = ds.n_tokens < 16 ? ds.n_tokens : 16;
    if (n > 0) mt_dataset_read(&ds, ds.n_tokens - n, n, out);
    mt_dataset_close(&ds);
    return 0;
}
