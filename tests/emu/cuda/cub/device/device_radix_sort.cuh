/* cub/device/device_radix_sort.cuh: cub::DeviceRadixSort::SortPairs for
 * the host emulation of the CUDA kernels (tests/emu/cuda): a stable sort
 * of the pairs by the key bits [begin_bit, end_bit), signed keys in
 * numeric order as CUB orders them, after the stream's queued work.  The
 * size query asks for some temporary storage, and a sort checks that it
 * got that much, as CUB does. */
#ifndef MT_EMU_CUB_RADIX_SORT_H
#define MT_EMU_CUB_RADIX_SORT_H

#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>
#include "emu.h"

namespace cub {
struct DeviceRadixSort {
    template <typename K, typename V>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out,
                                 const V *values_in, V *values_out, int n, int begin_bit = 0,
                                 int end_bit = (int)sizeof(K) * 8, cudaStream_t s = 0)
    {
        const size_t need = (size_t)(n > 0 ? n : 1) * (sizeof(K) + sizeof(V)) + 1024;
        if (!temp) {
            temp_bytes = need;
            return cudaSuccess;
        }
        if (temp_bytes < need || n < 0 || begin_bit < 0 || end_bit > (int)sizeof(K) * 8 ||
            begin_bit >= end_bit)
            return cudaErrorInvalidValue;
        if (!mt_emu_device_ptr(temp) || !mt_emu_device_ptr(keys_in) ||
            !mt_emu_device_ptr(keys_out) || !mt_emu_device_ptr(values_in) ||
            !mt_emu_device_ptr(values_out))
            return cudaErrorInvalidValue; /* host memory: the device would fault */
        mt_emu_drain(s);
        typedef typename std::make_unsigned<K>::type U;
        const U flip = std::is_signed<K>::value ? (U)((U)1 << (sizeof(K) * 8 - 1)) : (U)0;
        const int width = end_bit - begin_bit;
        const U mask = width >= (int)sizeof(U) * 8 ? (U)~(U)0 : (U)(((U)1 << width) - 1);
        auto bits = [&](K k) { return (U)((((U)k ^ flip) >> begin_bit) & mask); };
        std::vector<int> order((size_t)n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return bits(keys_in[a]) < bits(keys_in[b]); });
        std::vector<K> k((size_t)n);
        std::vector<V> v((size_t)n);
        for (int i = 0; i < n; i++)
            k[(size_t)i] = keys_in[order[(size_t)i]], v[(size_t)i] = values_in[order[(size_t)i]];
        std::copy(k.begin(), k.end(), keys_out);
        std::copy(v.begin(), v.end(), values_out);
        return cudaSuccess;
    }
};
} /* namespace cub */

#endif
