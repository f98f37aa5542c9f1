// The AVX-512F functions' attribute and region (the build's baseline is AVX2; they run where avx512_kernels() says):
// CASTOR_AVX512 before each function, CASTOR_AVX512_BEGIN ... CASTOR_AVX512_END around them, which silences GCC 12's
// -Wuninitialized / -Wmaybe-uninitialized on its own AVX-512 headers' _mm512_undefined_ps() (PR105593).
#pragma once

#define CASTOR_AVX512 __attribute__((target("avx512f")))
#if defined(__GNUC__) && !defined(__clang__)
#define CASTOR_AVX512_BEGIN                                                            \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define CASTOR_AVX512_END _Pragma("GCC diagnostic pop")
#else
#define CASTOR_AVX512_BEGIN
#define CASTOR_AVX512_END
#endif
