// Bandwidth of bulk float32 <-> float16/bfloat16 conversion against memcpy on 256 MiB, with 1 and 2 threads.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "bench_util.h"
#include "castor/convert.h"

namespace {

constexpr size_t kBytes = size_t{256} << 20;
constexpr size_t kFloats = kBytes / sizeof(float);
constexpr int kReps = 5;

// memcpy split into 1 MiB pieces over the OpenMP threads, like the conversions' chunking.
void parallel_memcpy(char* dst, const char* src, size_t bytes) {
  constexpr size_t kPiece = size_t{1} << 20;
  const auto pieces = static_cast<ptrdiff_t>((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
  for (ptrdiff_t p = 0; p < pieces; ++p) {
    size_t begin = static_cast<size_t>(p) * kPiece;
    std::memcpy(dst + begin, src + begin, std::min(kPiece, bytes - begin));
  }
}

}  // namespace

int main() {
  std::unique_ptr<float[]> f32(new float[kFloats]), f32_out(new float[kFloats]);
  std::unique_ptr<uint16_t[]> b16(new uint16_t[kFloats]);
  uint32_t state = 12345;
  for (size_t i = 0; i < kFloats; ++i) {  // normal values in (-128, 128): within float16 range
    state = state * 1664525u + 1013904223u;
    f32[i] = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) * 0x1p-16f;
  }
  std::memset(f32_out.get(), 0, kBytes);
  std::memset(b16.get(), 0, kBytes / 2);

  std::printf("conversion_isa: %s, buffer %zu MiB of float32 (%zu elements), best of %d\n", castor::conversion_isa(),
              kBytes >> 20, kFloats, kReps);
  std::printf("%-8s %-10s %10s %10s %8s\n", "threads", "op", "MiB moved", "GB/s", "vs copy");
  const double mib = 1024.0 * 1024.0;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    auto* out_bytes = reinterpret_cast<char*>(f32_out.get());
    auto* in_bytes = reinterpret_cast<const char*>(f32.get());
    const double copy_bytes = 2.0 * kBytes;
    const double copy_gbs = copy_bytes /
                            castor::bench::best_seconds([&] { parallel_memcpy(out_bytes, in_bytes, kBytes); }, kReps) /
                            1e9;
    std::printf("%-8d %-10s %10.0f %10.2f %7.0f%%\n", threads, "memcpy", copy_bytes / mib, copy_gbs, 100.0);
    struct Op {
      const char* name;
      void (*run)(float*, uint16_t*, float*);
    };
    const Op ops[] = {
        {"f32->bf16", [](float* f, uint16_t* h, float*) { castor::convert_f32_to_bf16(f, h, kFloats); }},
        {"bf16->f32", [](float*, uint16_t* h, float* o) { castor::convert_bf16_to_f32(h, o, kFloats); }},
        {"f32->f16", [](float* f, uint16_t* h, float*) { castor::convert_f32_to_f16(f, h, kFloats); }},
        {"f16->f32", [](float*, uint16_t* h, float* o) { castor::convert_f16_to_f32(h, o, kFloats); }},
    };
    const double conv_bytes = kBytes + kBytes / 2.0;  // 4 bytes read/written + 2 written/read per element
    for (const Op& op : ops) {
      double gbs = conv_bytes /
                   castor::bench::best_seconds([&] { op.run(f32.get(), b16.get(), f32_out.get()); }, kReps) / 1e9;
      std::printf("%-8d %-10s %10.0f %10.2f %7.0f%%\n", threads, op.name, conv_bytes / mib, gbs,
                  100.0 * gbs / copy_gbs);
    }
  }
  return 0;
}
