/* test_f16: the writer's float32 to IEEE half conversion (mt_f32_to_f16,
 * src/hf/hf_export.c), which a consolidated save of an F16 model relies on
 * to give back the source's bytes.  Every half value survives the round
 * trip through float32 (NaN stays NaN, quiet, same sign); every midpoint
 * between neighbouring halves rounds to the even one, and the floats
 * beside it to the nearer; overflow goes to infinity at 65520, underflow
 * to zero below 2^-25.  Where the compiler has _Float16 (an independent
 * conversion, IEEE round to nearest even), a sweep over the float32 bit
 * patterns agrees with it.  No MPI. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hf_internal.h"
#include "mt_test.h"

static float bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int is_nan16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

static void test_round_trip(void)
{
    int bad = 0, badnan = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = mt_f16_to_f32((uint16_t)h);
        uint16_t back = mt_f32_to_f16(f);
        if (is_nan16((uint16_t)h))
            badnan += !is_nan16(back) || (back & 0x8000u) != (h & 0x8000u) || !(back & 0x200u);
        else
            bad += back != h;
    }
    CHECK(bad == 0, "%d half values do not survive the round trip", bad);
    CHECK(badnan == 0, "%d NaNs do not stay quiet NaNs of their sign", badnan);
}

static void test_midpoints(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 0x7bffu; h++) { /* neighbours h, h + 1, both finite */
        float a = mt_f16_to_f32((uint16_t)h), b = mt_f16_to_f32((uint16_t)(h + 1));
        float mid = a + (b - a) / 2; /* exact: 12 significant bits */
        uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
        bad += mt_f32_to_f16(mid) != even;
        bad += mt_f32_to_f16(nextafterf(mid, 0.0f)) != h;
        bad += mt_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1;
        bad += mt_f32_to_f16(-mid) != (0x8000u | even);
    }
    CHECK(bad == 0, "%d midpoint cases round wrongly", bad);
    CHECK(mt_f32_to_f16(65519.996f) == 0x7bff, "below 65520: the largest half");
    CHECK(mt_f32_to_f16(65520.0f) == 0x7c00, "65520 ties to even: infinity");
    CHECK(mt_f32_to_f16(1e30f) == 0x7c00 && mt_f32_to_f16(-INFINITY) == 0xfc00, "overflow");
    CHECK(mt_f32_to_f16(bits(0x33000000u)) == 0, "2^-25 ties to even: zero");
    CHECK(mt_f32_to_f16(nextafterf(bits(0x33000000u), 1.0f)) == 1, "above 2^-25: 2^-24");
    CHECK(mt_f32_to_f16(bits(1u)) == 0 && mt_f32_to_f16(-0.0f) == 0x8000, "tiny and -0");
}

static void test_against_compiler(void)
{
#ifdef __FLT16_MAX__
    int bad = 0;
    uint32_t first = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093) { /* a prime stride: every exponent */
        float f = bits((uint32_t)u);
        _Float16 c = (_Float16)f;
        uint16_t ref;
        memcpy(&ref, &c, 2);
        uint16_t got = mt_f32_to_f16(f);
        if (isnan(f) ? !is_nan16(got) : got != ref) {
            if (!bad)
                first = (uint32_t)u;
            bad++;
        }
    }
    CHECK(bad == 0, "%d floats convert unlike _Float16, the first 0x%08x", bad, first);
#else
    printf("test_f16: no _Float16 in this compiler; the sweep against it is skipped\n");
#endif
}

int main(void)
{
    test_round_trip();
    test_midpoints();
    test_against_compiler();
    return mt_test_exit("test_f16");
}
