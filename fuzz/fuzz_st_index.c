/* fuzz_st_index.c — libFuzzer target for td_st_index_parse (core/safetensors).
 *
 * The input is a model.safetensors.index.json image. When accepted, the result's promises
 * are asserted: names sorted and unique, every shard name plain and listed once in the
 * sorted shard_files, and shards[i] pointing into shard_files.
 * Seeds: fuzz/corpus/fuzz_st_index.
 */
#include "safetensors.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    td_st_index idx;
    td_err err;
    if (td_st_index_parse((const char *)data, size, "fuzz.index.json", &idx, &err) != TD_OK) {
        TD_ASSERT(idx.n == 0 && idx.names == NULL && idx.shard_files == NULL);
        TD_ASSERT(err.code != TD_OK && strstr(err.msg, "fuzz.index.json") != NULL);
        return 0;
    }
    TD_ASSERT(idx.n > 0 && idx.n_shards > 0 && idx.n_shards <= idx.n);
    for (size_t i = 0; i < idx.n; i++) {
        if (i > 0) TD_ASSERT(strcmp(idx.names[i - 1], idx.names[i]) < 0);
        bool found = false;
        for (size_t j = 0; j < idx.n_shards; j++) found |= idx.shards[i] == idx.shard_files[j];
        TD_ASSERT(found);
    }
    for (size_t j = 0; j < idx.n_shards; j++) {
        const char *s = idx.shard_files[j];
        size_t n = strlen(s);
        TD_ASSERT(n > 12 && strcmp(s + n - 12, ".safetensors") == 0);
        TD_ASSERT(!strchr(s, '/') && !strstr(s, ".."));
        if (j > 0) TD_ASSERT(strcmp(idx.shard_files[j - 1], s) < 0);
    }
    td_st_index_free(&idx);
    return 0;
}
