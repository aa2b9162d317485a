// What Brisk's lazy MLX primitives share (primitives.cpp, tiled.cpp): CPU-only nodes whose
// inputs are plain row-major buffers, read in place where they already are.

#pragma once

#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"

namespace brisk_primitives {

namespace mx = mlx::core;

inline mx::Stream cpu_stream() { return mx::default_stream(mx::Device::cpu); }

inline int64_t leading_rows(const mx::array& x) { return x.ndim() == 0 ? 1 : x.size() / x.shape(-1); }

inline mx::Shape with_last(const mx::array& x, int last) {
  mx::Shape shape = x.shape();
  shape.back() = last;
  return shape;
}

inline void allocate(mx::array& out) { out.set_data(mx::allocator::malloc(out.nbytes())); }

// The kernels read plain row-major buffers: a strided view is copied first (lazily). An array
// already in memory as one (a weight) needs no Contiguous node: a decode step held ~630 of
// them, a few microseconds each. Nor does a single value (an offset or a length), lazy or not.
inline mx::array plain(const mx::array& a, mx::Dtype dtype, const mx::Stream& s) {
  if (a.dtype() == dtype && ((a.is_available() && a.flags().row_contiguous) || a.size() == 1)) return a;
  return mx::contiguous(mx::astype(a, dtype, s), false, s);
}

// A float32 input as a row-major buffer, for an input still lazy when the node is built (its
// layout is known only once MLX evaluates the graph): read in place when it is row-major, as
// it nearly always is, else gathered into a temporary on the stream just before the kernel.
struct RowMajor {
  const float* source;
  float* copy = nullptr;
  mx::Shape shape;
  mx::Strides strides;

  const float* data() const { return copy ? copy : source; }

  void gather() const {
    if (!copy) return;
    std::vector<int> index(shape.size(), 0);
    const int64_t total = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<int64_t>());
    for (int64_t i = 0; i < total; ++i) {
      int64_t at = 0;
      for (size_t a = 0; a < shape.size(); ++a) at += index[a] * strides[a];
      copy[i] = source[at];
      for (int a = int(shape.size()) - 1; a >= 0 && ++index[a] == shape[a]; --a) index[a] = 0;
    }
  }
};

inline RowMajor row_major(const mx::array& a, mx::cpu::CommandEncoder& encoder) {
  RowMajor view{a.data<float>(), nullptr, a.shape(), a.strides()};
  if (!a.flags().row_contiguous) {
    mx::array copy(a.shape(), mx::float32, nullptr, {});
    allocate(copy);
    view.copy = copy.data<float>();
    encoder.add_temporary(std::move(copy));  // freed once the task has run
  }
  return view;
}

// A weight already in memory as a strided view would be copied on every call, which costs
// more than the kernel saves: the caller keeps MLX's matmul (ValueError in Python).
inline void require_plain_weight(const mx::array& w) {
  if (w.is_available() && !w.flags().row_contiguous)
    throw std::invalid_argument("a strided weight (the kernel would copy it on every call)");
}

// What every primitive here shares: CPU only, its output allocated and its arrays declared to
// the stream's encoder before the kernel is enqueued.
class CpuPrimitive : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string(name()) + " runs on the CPU only");
  }

 protected:
  mx::cpu::CommandEncoder& prepare(const std::vector<mx::array>& inputs, mx::array& out) {
    allocate(out);
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    return encoder;
  }
};

}  // namespace brisk_primitives
