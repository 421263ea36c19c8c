/* The body CRC of the compiled core (s25-core, issue 21 target 5): zlib's CRC-32 (the
 * record layout's body_crc), by carry-less multiplication when the CPU has it.
 *
 * zlib 1.2.13's crc32_z took ~190 ns on a 128-byte body here (0.7 GB/s; 3.2 GB/s on
 * 64 KiB): the largest single share of a put_run. Folding 64 bytes at a time with
 * PCLMULQDQ (the method of Intel's white paper "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction", with its constants for the reflected
 * polynomial 0x04C11DB7) takes ~8 ns on 128 bytes; the tail of fewer than 16 bytes, a
 * body under 64 bytes and a CPU without the instruction take zlib's crc32_z, so the
 * answer is zlib's byte for byte (tests/format/test_ccore_crc32.py). */
#ifndef TIDE_CRC32_H
#define TIDE_CRC32_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TIDE_CLMUL 1
#define CLMUL(a, b, imm) _mm_clmulepi64_si128((a), (b), (imm))
#define LOAD16(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

/* x folded forward over 128 bits (k: 128-bit distance constants; k12 folds over 512),
 * xor next. */
__attribute__((target("pclmul,sse4.1"))) static inline __m128i crc_fold16(__m128i x, __m128i k,
                                                                          __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(CLMUL(x, k, 0x00), CLMUL(x, k, 0x11)), next);
}

/* The reflected CRC-32 state after len bytes from state (len >= 64, a multiple of 16). */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul_state(uint32_t state,
                                                                           const unsigned char *p,
                                                                           size_t len) {
    const __m128i k12 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL); /* x^(512+-32,+32) */
    const __m128i k34 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL); /* x^(128+-32,+32) */
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);              /* x^64 mod P */
    const __m128i poly = _mm_set_epi64x(0x1F7011641LL, 0x1DB710641LL); /* mu, P (Barrett) */
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_xor_si128(LOAD16(p), _mm_cvtsi32_si128((int)state));
    __m128i x2 = LOAD16(p + 16), x3 = LOAD16(p + 32), x4 = LOAD16(p + 48);
    for (p += 64, len -= 64; len >= 64; p += 64, len -= 64) {
        x1 = crc_fold16(x1, k12, LOAD16(p));
        x2 = crc_fold16(x2, k12, LOAD16(p + 16));
        x3 = crc_fold16(x3, k12, LOAD16(p + 32));
        x4 = crc_fold16(x4, k12, LOAD16(p + 48));
    }
    x1 = crc_fold16(crc_fold16(crc_fold16(x1, k34, x2), k34, x3), k34, x4);
    for (; len >= 16; p += 16, len -= 16) {
        x1 = crc_fold16(x1, k34, LOAD16(p));
    }
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), CLMUL(k34, x1, 0x01)); /* 128 -> 64 bits */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), CLMUL(_mm_and_si128(x1, mask32), k5, 0x00));
    __m128i t = CLMUL(_mm_and_si128(x1, mask32), poly, 0x10); /* Barrett: 64 -> 32 bits */
    t = CLMUL(_mm_and_si128(t, mask32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x1, t), 1);
}
#endif

/* zlib's crc32(0, p, len). */
static uint32_t body_crc(const unsigned char *p, size_t len) {
#ifdef TIDE_CLMUL
    static int clmul = -1; /* (asked once; a race only asks twice) */
    if (clmul < 0) {
        clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }
    if (len >= 64 && clmul) {
        size_t whole = len & ~(size_t)15;
        uint32_t crc = ~crc32_clmul_state(0xFFFFFFFFu, p, whole);
        return (uint32_t)crc32_z(crc, p + whole, len - whole);
    }
#endif
    return (uint32_t)crc32_z(0L, p, len);
}

#endif
