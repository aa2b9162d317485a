// The native CPU kernels as lazy MLX primitives: nodes of MLX's graph, evaluated with the
// rest of it on the CPU stream.
//
// Called through ctypes, a kernel must evaluate its inputs first: a decode step of a
// 30-layer model then synchronises with MLX about 210 times and copies each output back
// into a fresh array, and that cost SmolLM2's 4-bit decode more than the kernels' own
// time (shared/CPU.md, issue 17). As primitives the kernels only enqueue work.
//
// The kernels themselves are the extern "C" functions of ../quantized_matmul.cpp,
// ../skinny_matmul.cpp, ../attention.cpp, ../norm_rope.cpp, ../packed_attention.cpp and ../sampling.cpp, compiled into this module
// (the tiled products' primitives are in tiled.cpp); kernels/mlx_extension.py builds it
// against the installed mlx wheel's headers and libmlx, with nanobind in MLX's domain so
// the functions take and return mlx.core.array. The Python side checks every shape,
// dtype and format before building a node: a node is only made for calls the kernel
// takes, so eval_cpu never has to decline.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/variant.h>

#include <array>
#include <cstring>
#include <functional>
#include <numeric>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/stream.h"
#include "mlx/utils.h"
#include "primitive_base.h"

extern "C" {
int brisk_quantized_matmul_rows(const float*, const uint32_t*, const void*, const void*, int, const float*, float*,
                                int, int, int, int, int, int, int);
int brisk_quantized_matmul_dense(const float*, const uint32_t*, const void*, const void*, int, const float*, float*,
                                 int, int, int, int, int, int, int);
int brisk_quantized_gather(const int32_t*, int, const uint32_t*, const void*, const void*, int, float*, int, int,
                           int, int);
int brisk_quantized_matmul_has_sgemm();
int brisk_skinny_matmul(const float*, const float*, const float*, float*, int, int, int, int);
int brisk_float_gemm(const float*, const float*, const float*, float*, int, int, int, int);
int brisk_float_gemm_available();
int brisk_attention(const float*, const void*, const void*, int, float*, int, int, int, int, int, int, const int64_t*,
                    const int64_t*, float, int, const float*, int, int);
int brisk_rms_norm(const float*, const float*, float*, int64_t, int, float);
int brisk_swiglu(const float*, const float*, float*, int64_t, int);
int brisk_sample_softmax(const float*, int64_t, int, float, const float*, uint32_t*);
int brisk_pooled_attention_max(const float*, int, int, int64_t, int64_t, int64_t, int64_t, int, float*, int);
int brisk_kv_attention_flat(const float*, float*, int, int, int, int, int, int, int, float, int, const int32_t*,
                            const void* const*, const int64_t*, const int32_t*, const void* const*, const int64_t*);
int brisk_rope(const float*, const int64_t*, float*, int, int, int, int, int, int, float, float, int64_t, const int32_t*,
               int, const float*);
}

namespace nb = nanobind;
namespace mx = mlx::core;
using namespace brisk_primitives;

namespace {

constexpr int kMaxQuantizedFewRows = 32;  // quantized_matmul.cpp's few-row limit


// y = x @ dequantize(w).T (+ bias), x float32 (..., K), w MLX affine-quantized (N, K).
class QuantizedMatmul : public CpuPrimitive {
 public:
  QuantizedMatmul(mx::Stream s, int bits, int group, int scale_type, int threads, bool has_bias, int integer_x)
      : CpuPrimitive(s), bits_(bits), group_(group), scale_type_(scale_type), threads_(threads),
        has_bias_(has_bias), integer_x_(integer_x) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &x = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int M = int(leading_rows(x)), K = int(x.shape(-1)), N = int(w.shape(0));
    encoder.dispatch([xs = row_major(x, encoder), w = w.data<uint32_t>(), s = scales.data<void>(),
                      b = biases.data<void>(), bias = has_bias_ ? inputs[4].data<float>() : nullptr,
                      y = out.data<float>(), M, K, N, bits = bits_, group = group_, type = scale_type_,
                      threads = threads_, integer_x = integer_x_]() {
      xs.gather();
      const float* x = xs.data();
      const int code = M <= kMaxQuantizedFewRows
                           ? brisk_quantized_matmul_rows(x, w, s, b, type, bias, y, M, K, N, bits, group, threads, integer_x)
                           : brisk_quantized_matmul_dense(x, w, s, b, type, bias, y, M, K, N, bits, group, threads, integer_x);
      if (code) throw std::runtime_error("brisk quantized matmul declined (code " + std::to_string(code) + ")");
    });
  }

  const char* name() const override { return "BriskQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedMatmul&>(other);
    return bits_ == o.bits_ && group_ == o.group_ && scale_type_ == o.scale_type_ && threads_ == o.threads_ &&
           has_bias_ == o.has_bias_ && integer_x_ == o.integer_x_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {with_last(inputs[0], int(inputs[1].shape(0)))};
  }

 private:
  int bits_, group_, scale_type_, threads_;
  bool has_bias_;
  int integer_x_;  // the kernels' integer_x: 0 float x, 1 fastest, 2 without VNNI, 3 without AMX
};

// Rows `ids` of a quantized (V, K) table, dequantized to float32: the embedding lookup.
class QuantizedGather : public CpuPrimitive {
 public:
  QuantizedGather(mx::Stream s, int bits, int group, int scale_type)
      : CpuPrimitive(s), bits_(bits), group_(group), scale_type_(scale_type) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &ids = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int count = int(ids.size()), V = int(w.shape(0)), K = int(out.shape(-1));
    encoder.dispatch([ids = ids.data<int32_t>(), w = w.data<uint32_t>(), s = scales.data<void>(),
                      b = biases.data<void>(), y = out.data<float>(), count, V, K, bits = bits_, group = group_,
                      type = scale_type_]() {
      if (brisk_quantized_gather(ids, count, w, s, b, type, y, V, K, bits, group))
        throw std::out_of_range("brisk quantized embedding: a token id outside the vocabulary");
    });
  }

  const char* name() const override { return "BriskQuantizedGather"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedGather&>(other);
    return bits_ == o.bits_ && group_ == o.group_ && scale_type_ == o.scale_type_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.push_back(int(inputs[1].shape(1)) * 32 / bits_);
    return {shape};
  }

 private:
  int bits_, group_, scale_type_;
};

// y = x @ w.T (+ bias) for float32 x and float32 w (N, K): 1-16 rows (the verify pass,
// ../skinny_matmul.cpp) or, `wide`, a prefill chunk (../float_gemm.cpp, AVX-512 CPUs).
class SkinnyMatmul : public CpuPrimitive {
 public:
  SkinnyMatmul(mx::Stream s, int threads, bool has_bias, bool wide)
      : CpuPrimitive(s), threads_(threads), has_bias_(has_bias), wide_(wide) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &x = inputs[0], &w = inputs[1];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int M = int(leading_rows(x)), K = int(x.shape(-1)), N = int(w.shape(0));
    encoder.dispatch([xs = row_major(x, encoder), w = w.data<float>(),
                      bias = has_bias_ ? inputs[2].data<float>() : nullptr, y = out.data<float>(), M, K, N,
                      threads = threads_, wide = wide_]() {
      xs.gather();
      if (wide ? brisk_float_gemm(xs.data(), w, bias, y, M, K, N, threads)
               : brisk_skinny_matmul(xs.data(), w, bias, y, M, K, N, threads))
        throw std::runtime_error(wide ? "brisk float gemm declined" : "brisk skinny matmul declined");
    });
  }

  const char* name() const override { return wide_ ? "BriskFloatGemm" : "BriskSkinnyMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const SkinnyMatmul&>(other);
    return threads_ == o.threads_ && has_bias_ == o.has_bias_ && wide_ == o.wide_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {with_last(inputs[0], int(inputs[1].shape(0)))};
  }

 private:
  int threads_;
  bool has_bias_, wide_;
};

// softmax(q k^T * scale) v for float32 q (B, Hq, L, D), k and v (B, Hkv, S, D) both float32 or
// both float16 (a half-precision KV cache, read as it is stored); causal puts query i at
// position S - L + i (MLX's "causal"). Keys and values are read in place through their
// strides (a KV cache's sliced views), rows copied only if a row itself is strided.
// With a `length` input (an int32 scalar, read when the node runs) only the first `length`
// key positions count: a compiled decode step attends over a fixed-size cache buffer.
class Attention : public CpuPrimitive {
 public:
  Attention(mx::Stream s, float scale, bool causal, bool has_sinks, bool has_length, bool half, int threads,
            bool coarse)
      : CpuPrimitive(s), scale_(scale), causal_(causal), has_sinks_(has_sinks), has_length_(has_length), half_(half),
        threads_(threads), coarse_(coarse) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& q = inputs[0];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int B = int(q.shape(0)), Hq = int(q.shape(1)), L = int(q.shape(2)), D = int(q.shape(3));
    const int Hkv = int(inputs[1].shape(1)), S = int(inputs[1].shape(2));
    View k = view(inputs[1], encoder), v = view(inputs[2], encoder);
    const float* sinks = has_sinks_ ? inputs[3].data<float>() : nullptr;
    const int32_t* length = has_length_ ? inputs.back().data<int32_t>() : nullptr;
    encoder.dispatch([qs = row_major(q, encoder), k, v, sinks, length, y = out.data<float>(), B, Hq, Hkv, L, S, D,
                      scale = scale_, causal = causal_, half = half_, threads = threads_, coarse = coarse_]() {
      qs.gather();
      k.gather_rows();
      v.gather_rows();
      if (length && (*length < L || *length > S)) throw std::out_of_range("brisk attention: a length outside the keys");
      const int used = length ? *length : S;
      if (brisk_attention(qs.data(), k.data(), v.data(), half, y, B, Hq, Hkv, L, used, D, k.strides.data(),
                          v.strides.data(), scale, causal, sinks, threads, coarse))
        throw std::runtime_error("brisk attention declined its shapes");
    });
  }

  const char* name() const override { return "BriskAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Attention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && has_sinks_ == o.has_sinks_ && has_length_ == o.has_length_ &&
           half_ == o.half_ && threads_ == o.threads_ && coarse_ == o.coarse_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  // Keys or values as the kernel reads them: in place through their strides, or, when a row
  // itself is strided (rare: a transposed cache), gathered into a contiguous copy on the
  // stream just before the kernel runs.
  struct View {
    const char* source;
    char* copy = nullptr;
    size_t item;  // bytes per element: 4, or 2 for float16
    mx::Shape shape;
    mx::Strides source_strides;
    std::array<int64_t, 3> strides;

    const void* data() const { return copy ? copy : source; }
    void gather_rows() const {
      if (!copy) return;
      int64_t i = 0;
      const auto& st = source_strides;
      for (int b = 0; b < shape[0]; ++b)
        for (int h = 0; h < shape[1]; ++h)
          for (int p = 0; p < shape[2]; ++p)
            for (int d = 0; d < shape[3]; ++d, ++i)
              std::memcpy(copy + i * item, source + (b * st[0] + h * st[1] + p * st[2] + d * st[3]) * item, item);
    }
  };

  static View view(const mx::array& a, mx::cpu::CommandEncoder& encoder) {
    View v{a.data<char>(), nullptr, a.itemsize(), a.shape(), a.strides(),
           {a.strides()[0], a.strides()[1], a.strides()[2]}};
    if (a.strides().back() != 1 && a.shape(-1) != 1) {
      mx::array copy(a.shape(), a.dtype(), nullptr, {});
      allocate(copy);
      v.copy = copy.data<char>();
      v.strides = {int64_t(a.shape(1)) * a.shape(2) * a.shape(3), int64_t(a.shape(2)) * a.shape(3), a.shape(3)};
      encoder.add_temporary(std::move(copy));  // freed once the task has run
    }
    return v;
  }

  float scale_;
  bool causal_, has_sinks_, has_length_, half_;
  int threads_;
  bool coarse_;
};

// Decode attention over a packed KV cache (../packed_attention.cpp). Inputs: the queries,
// then for K and then V its packed data, scales and biases (when packed), its dense rows
// (when it has any) and its per-row packed limits (keys, when given). `meta` is the kernel's
// layout, bits, group, packed, dense_from, scales_half, dense_half for each.
class PackedAttention : public CpuPrimitive {
 public:
  struct Part {
    std::array<int32_t, 7> meta;
    bool packed, dense, limits;
    bool operator==(const Part&) const = default;
  };

  PackedAttention(mx::Stream s, int keys, int kv_heads, float scale, bool causal, int threads, Part k, Part v)
      : CpuPrimitive(s), keys_(keys), kv_heads_(kv_heads), scale_(scale), causal_(causal), threads_(threads), k_(k),
        v_(v) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& q = inputs[0];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int B = int(q.shape(0)), Hq = int(q.shape(1)), L = int(q.shape(2)), D = int(q.shape(3));
    size_t next = 1;
    Flat k = flat(k_, inputs, next, encoder), v = flat(v_, inputs, next, encoder);
    encoder.dispatch([qs = row_major(q, encoder), k, v, y = out.data<float>(), B, Hq, L, D, keys = keys_,
                      kv_heads = kv_heads_, scale = scale_, causal = causal_, threads = threads_]() {
      qs.gather();
      k.gather();
      v.gather();
      if (brisk_kv_attention_flat(qs.data(), y, B, Hq, kv_heads, L, keys, D, causal, scale, threads, k.meta.data(),
                                  k.pointers.data(), k.strides.data(), v.meta.data(), v.pointers.data(),
                                  v.strides.data()))
        throw std::runtime_error("brisk packed attention declined its layout");
    });
  }

  const char* name() const override { return "BriskPackedAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const PackedAttention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && threads_ == o.threads_ && k_ == o.k_ && v_ == o.v_ &&
           keys_ == o.keys_ && kv_heads_ == o.kv_heads_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  // One of K or V as the kernel's flat arguments. An array whose last axis is strided (none
  // that Brisk's caches make) is copied, element by element, just before the kernel runs.
  struct Copy {
    const char* source;
    char* target;
    size_t itemsize;
    mx::Shape shape;
    mx::Strides strides;
  };
  struct Flat {
    std::array<int32_t, 7> meta;
    std::array<const void*, 5> pointers{};
    std::array<int64_t, 12> strides{};
    std::vector<Copy> copies;

    void gather() const {
      for (const auto& c : copies) {
        size_t i = 0;
        for (int a = 0; a < c.shape[0]; ++a)
          for (int b = 0; b < c.shape[1]; ++b)
            for (int p = 0; p < c.shape[2]; ++p)
              for (int d = 0; d < c.shape[3]; ++d, ++i) {
                const int64_t at = a * c.strides[0] + b * c.strides[1] + p * c.strides[2] + d * c.strides[3];
                std::memcpy(c.target + i * c.itemsize, c.source + at * c.itemsize, c.itemsize);
              }
      }
    }
  };

  static Flat flat(const Part& part, const std::vector<mx::array>& inputs, size_t& next,
                   mx::cpu::CommandEncoder& encoder) {
    Flat f{part.meta};
    const auto place = [&](const mx::array& a, int pointer, int stride_slot) {
      const char* base = a.data<char>();
      mx::Strides st = a.strides();
      if (a.shape(-1) > 1 && st.back() != 1) {
        mx::array copy(a.shape(), a.dtype(), nullptr, {});
        allocate(copy);
        f.copies.push_back({base, copy.data<char>(), a.itemsize(), a.shape(), st});
        base = copy.data<char>();
        st = {int64_t(a.shape(1)) * a.shape(2) * a.shape(3), int64_t(a.shape(2)) * a.shape(3), a.shape(3), 1};
        encoder.add_temporary(std::move(copy));  // freed once the task has run
      }
      f.pointers[pointer] = base;
      if (stride_slot >= 0)
        for (int i = 0; i < 3; ++i) f.strides[stride_slot * 3 + i] = a.shape(i) == 1 ? 0 : st[i];
    };
    if (part.packed)
      for (int i = 0; i < 3; ++i) place(inputs[next++], i, i);
    if (part.dense) place(inputs[next++], 3, 3);
    if (part.limits) f.pointers[4] = inputs[next++].data<int32_t>();
    return f;
  }

  int keys_, kv_heads_;
  float scale_;
  bool causal_;
  int threads_;
  Part k_, v_;
};

// x * rsqrt(mean(x^2) + eps) * w over the last axis of float32 x: mx.fast.rms_norm in one node.
class RmsNorm : public CpuPrimitive {
 public:
  RmsNorm(mx::Stream s, float eps) : CpuPrimitive(s), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &x = inputs[0], &w = inputs[1];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    encoder.dispatch([xs = row_major(x, encoder), w = w.data<float>(), y = out.data<float>(),
                      rows = leading_rows(x), D = int(x.shape(-1)), eps = eps_]() {
      xs.gather();
      brisk_rms_norm(xs.data(), w, y, rows, D, eps);
    });
  }

  const char* name() const override { return "BriskRmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RmsNorm&>(other).eps_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  float eps_;
};

// silu(gate) * up for float32 arrays of one shape: SwiGLU's activation in one node (activation.cpp).
class Swiglu : public CpuPrimitive {
 public:
  Swiglu(mx::Stream s, int threads) : CpuPrimitive(s), threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    encoder.dispatch([gate = row_major(inputs[0], encoder), up = row_major(inputs[1], encoder),
                      y = out.data<float>(), n = int64_t(out.size()), threads = threads_]() {
      gate.gather();
      up.gather();
      brisk_swiglu(gate.data(), up.data(), y, n, threads);
    });
  }

  const char* name() const override { return "BriskSwiglu"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return threads_ == static_cast<const Swiglu&>(other).threads_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  int threads_;
};

// A token per row of float32 logits (..., V) from softmax(logits / t), by inverse CDF on the
// row's uniform number in [0, 1): mlx-lm's temperature sampler in one node (sampling.cpp).
class SampleSoftmax : public CpuPrimitive {
 public:
  SampleSoftmax(mx::Stream s, float inv_temperature) : CpuPrimitive(s), inv_temperature_(inv_temperature) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &logits = inputs[0], &uniforms = inputs[1];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    encoder.dispatch([x = row_major(logits, encoder), u = uniforms.data<float>(), y = out.data<uint32_t>(),
                      rows = leading_rows(logits), V = int(logits.shape(-1)), t = inv_temperature_]() {
      x.gather();
      brisk_sample_softmax(x.data(), rows, V, t, u, y);
    });
  }

  const char* name() const override { return "BriskSampleSoftmax"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return inv_temperature_ == static_cast<const SampleSoftmax&>(other).inv_temperature_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& shape = inputs[0].shape();
    return {mx::Shape(shape.begin(), shape.end() - 1)};
  }

 private:
  float inv_temperature_;
};

// SpecPrefill's importance for a block of query rows at one layer (pooled_attention.cpp): of
// scaled float32 logits (H, rows, S), the maximum over heads of softmax over the keys each row
// saw, average-pooled over keys [start, end). Output (rows, end - start).
class PooledAttentionMax : public CpuPrimitive {
 public:
  PooledAttentionMax(mx::Stream s, int64_t visible_first, int64_t start, int64_t end, int kernel, int threads)
      : CpuPrimitive(s), visible_first_(visible_first), start_(start), end_(end), kernel_(kernel),
        threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& logits = inputs[0];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    encoder.dispatch([x = row_major(logits, encoder), y = out.data<float>(), heads = int(logits.shape(0)),
                      rows = int(logits.shape(1)), seen = int64_t(logits.shape(2)), first = visible_first_,
                      start = start_, end = end_, kernel = kernel_, threads = threads_]() {
      x.gather();
      brisk_pooled_attention_max(x.data(), heads, rows, seen, first, start, end, kernel, y, threads);
    });
  }

  const char* name() const override { return "BriskPooledAttentionMax"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const PooledAttentionMax&>(other);
    return visible_first_ == o.visible_first_ && start_ == o.start_ && end_ == o.end_ && kernel_ == o.kernel_ &&
           threads_ == o.threads_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {mx::Shape{inputs[0].shape(1), int(end_ - start_)}};
  }

 private:
  int64_t visible_first_, start_, end_;
  int kernel_, threads_;
};

// Rotary embedding of float32 x (B, H, L, D) or (B, L, D) at positions (offset + l) * scale:
// mx.fast.rope in one node. The offset is an integer, or an int32 array with one per batch
// entry (sparse prefill's per-token positions). Rows are read in place through their strides
// (the transposed projections mlx-lm hands it); the output is row-major.
class Rope : public CpuPrimitive {
 public:
  Rope(mx::Stream s, int dims, bool traditional, float base, float scale, int64_t offset, bool has_offsets,
       bool has_freqs)
      : CpuPrimitive(s), dims_(dims), traditional_(traditional), base_(base), scale_(scale), offset_(offset),
        has_offsets_(has_offsets), has_freqs_(has_freqs) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& x = inputs[0];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const bool three = x.ndim() == 3;  // (B, L, D): one head
    const int B = int(x.shape(0)), H = three ? 1 : int(x.shape(1)), L = int(x.shape(-2)), D = int(x.shape(-1));
    RowMajor xs{x.data<float>(), nullptr, x.shape(), x.strides()};
    std::array<int64_t, 3> strides{x.strides()[0], three ? 0 : x.strides()[1], x.strides()[x.ndim() - 2]};
    if (x.strides().back() != 1 && D > 1) {  // a strided row: gather a row-major copy first
      xs = row_major(x, encoder);
      strides = {int64_t(H) * L * D, int64_t(L) * D, D};
    }
    const mx::array* offsets = has_offsets_ ? &inputs[1] : nullptr;
    const mx::array* freqs = has_freqs_ ? &inputs[has_offsets_ ? 2 : 1] : nullptr;
    encoder.dispatch([xs, strides, y = out.data<float>(), B, H, L, D, dims = dims_, traditional = int(traditional_),
                      base = base_, scale = scale_, offset = offset_,
                      offsets = offsets ? offsets->data<int32_t>() : nullptr,
                      offsets_count = offsets ? int(offsets->size()) : 0,
                      freqs = freqs ? freqs->data<float>() : nullptr]() {
      xs.gather();
      brisk_rope(xs.data(), strides.data(), y, B, H, L, D, dims, traditional, base, scale, offset, offsets,
                 offsets_count, freqs);
    });
  }

  const char* name() const override { return "BriskRope"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Rope&>(other);
    return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ && scale_ == o.scale_ &&
           offset_ == o.offset_ && has_offsets_ == o.has_offsets_ && has_freqs_ == o.has_freqs_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
  int64_t offset_;
  bool has_offsets_, has_freqs_;
};

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                           std::optional<mx::array> bias, int bits, int group, int scale_type, int threads,
                           int integer_x) {
  require_plain_weight(w);
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{mx::astype(x, mx::float32, s), plain(w, mx::uint32, s),
                                plain(scales, scales.dtype(), s), plain(biases, biases.dtype(), s)};
  if (bias) inputs.push_back(plain(*bias, mx::float32, s));
  auto shape = with_last(x, int(w.shape(0)));
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<QuantizedMatmul>(s, bits, group, scale_type, threads, bias.has_value(), integer_x),
                   std::move(inputs));
}

mx::array quantized_gather(const mx::array& ids, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int bits, int group, int scale_type) {
  const auto s = cpu_stream();
  mx::Shape shape = ids.shape();
  shape.push_back(int(w.shape(1)) * 32 / bits);
  return mx::array(std::move(shape), mx::float32, std::make_shared<QuantizedGather>(s, bits, group, scale_type),
                   {plain(ids, mx::int32, s), plain(w, mx::uint32, s), plain(scales, scales.dtype(), s),
                    plain(biases, biases.dtype(), s)});
}

mx::array skinny_matmul(const mx::array& x, const mx::array& w, std::optional<mx::array> bias, int threads,
                        bool wide) {
  require_plain_weight(w);
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{mx::astype(x, mx::float32, s), plain(w, mx::float32, s)};
  if (bias) inputs.push_back(plain(*bias, mx::float32, s));
  auto shape = with_last(x, int(w.shape(0)));
  return mx::array(std::move(shape), mx::float32, std::make_shared<SkinnyMatmul>(s, threads, bias.has_value(), wide),
                   std::move(inputs));
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    std::optional<mx::array> sinks, std::optional<mx::array> length, int threads, bool coarse) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || k.shape() != v.shape() || q.shape(0) != k.shape(0) ||
      q.shape(3) != k.shape(3) || q.shape(1) % k.shape(1) || q.shape(3) % 8 || q.shape(3) > 256 ||
      q.shape(2) > k.shape(2) || q.shape(2) < 1 || q.shape(1) / k.shape(1) > 64)
    throw std::invalid_argument("attention shapes the kernel does not take");
  if (sinks && (sinks->ndim() != 1 || sinks->shape(0) != q.shape(1)))
    throw std::invalid_argument("attention sinks of a shape the kernel does not take (one per query head)");
  const auto s = cpu_stream();
  const bool half = k.dtype() == mx::float16 && v.dtype() == mx::float16;  // read as stored
  const auto kv_type = half ? mx::float16 : mx::float32;
  std::vector<mx::array> inputs{mx::astype(q, mx::float32, s), mx::astype(k, kv_type, s), mx::astype(v, kv_type, s)};
  if (sinks) inputs.push_back(plain(*sinks, mx::float32, s));
  if (length) {
    if (length->size() != 1 || !mx::issubdtype(length->dtype(), mx::integer))
      throw std::invalid_argument("an attention length the kernel does not take (one integer)");
    inputs.push_back(plain(*length, mx::int32, s));
  }
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<Attention>(s, scale, causal, sinks.has_value(), length.has_value(), half, threads, coarse),
                   std::move(inputs));
}

// `k_meta`/`v_meta`: the kernel's seven layout integers (see PackedAttention); the arrays of
// each part as that layout has them. kernels/native_attention.py checks the layout first.
mx::array packed_attention(const mx::array& q, int keys, int kv_heads, float scale, bool causal, int threads,
                           std::array<int32_t, 7> k_meta, std::optional<mx::array> k_data,
                           std::optional<mx::array> k_scales, std::optional<mx::array> k_biases,
                           std::optional<mx::array> k_dense, std::optional<mx::array> k_limits,
                           std::array<int32_t, 7> v_meta, std::optional<mx::array> v_data,
                           std::optional<mx::array> v_scales, std::optional<mx::array> v_biases,
                           std::optional<mx::array> v_dense) {
  if (q.ndim() != 4 || q.dtype() != mx::float32 || kv_heads <= 0 || q.shape(1) % kv_heads || q.shape(2) > keys)
    throw std::invalid_argument("packed attention queries the kernel does not take");
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{q};
  const auto add = [&](std::array<int32_t, 7> meta, std::optional<mx::array>& data, std::optional<mx::array>& scales,
                       std::optional<mx::array>& biases, std::optional<mx::array>& dense,
                       std::optional<mx::array> limits) {
    PackedAttention::Part part{meta, data.has_value(), dense.has_value(), limits.has_value()};
    if (part.packed != (scales.has_value() && biases.has_value()) || (!part.packed && !part.dense))
      throw std::invalid_argument("a packed attention part with missing arrays");
    for (auto* a : {&data, &scales, &biases, &dense})
      if (*a && (*a)->ndim() != 4) throw std::invalid_argument("packed attention arrays of other than 4 dimensions");
    if (part.packed) {
      inputs.push_back(*data);
      inputs.push_back(*scales);
      inputs.push_back(*biases);
    }
    if (part.dense) inputs.push_back(*dense);
    if (part.limits) {
      if (limits->size() != size_t(q.shape(2))) throw std::invalid_argument("packed limits for another row count");
      inputs.push_back(plain(*limits, mx::int32, s));
    }
    return part;
  };
  const auto k = add(k_meta, k_data, k_scales, k_biases, k_dense, k_limits);
  const auto v = add(v_meta, v_data, v_scales, v_biases, v_dense, std::nullopt);
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<PackedAttention>(s, keys, kv_heads, scale, causal, threads, k, v),
                   std::move(inputs));
}

mx::array sample_softmax(const mx::array& logits, const mx::array& uniforms, float inv_temperature) {
  if (logits.ndim() < 1 || logits.dtype() != mx::float32 || logits.shape(-1) < 1 || !(inv_temperature > 0.f) ||
      uniforms.dtype() != mx::float32 || uniforms.size() != size_t(leading_rows(logits)))
    throw std::invalid_argument("sample_softmax shapes, dtypes or temperature the kernel does not take");
  const auto s = cpu_stream();
  const auto& shape = logits.shape();
  return mx::array(mx::Shape(shape.begin(), shape.end() - 1), mx::uint32,
                   std::make_shared<SampleSoftmax>(s, inv_temperature),
                   {logits, plain(mx::reshape(uniforms, {int(uniforms.size())}, s), mx::float32, s)});
}

mx::array pooled_attention_max(const mx::array& logits, int64_t visible_first, int64_t start, int64_t end,
                               int kernel, int threads) {
  if (logits.ndim() != 3 || logits.dtype() != mx::float32 || logits.shape(0) < 1 || visible_first < 1 || kernel < 1 ||
      kernel % 2 == 0 || start < 0 || end < start || end > logits.shape(2))
    throw std::invalid_argument("pooled_attention_max shapes, dtypes or bounds the kernel does not take");
  const auto s = cpu_stream();
  return mx::array(mx::Shape{logits.shape(1), int(end - start)}, mx::float32,
                   std::make_shared<PooledAttentionMax>(s, visible_first, start, end, kernel, threads), {logits});
}

mx::array rms_norm(const mx::array& x, const mx::array& w, float eps) {
  if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != x.shape(-1) || x.dtype() != mx::float32)
    throw std::invalid_argument("rms_norm shapes or dtypes the kernel does not take");
  const auto s = cpu_stream();
  return mx::array(x.shape(), mx::float32, std::make_shared<RmsNorm>(s, eps), {x, plain(w, mx::float32, s)});
}

mx::array swiglu(const mx::array& gate, const mx::array& up, int threads) {
  if (gate.shape() != up.shape() || gate.dtype() != mx::float32 || up.dtype() != mx::float32)
    throw std::invalid_argument("swiglu takes float32 gate and up of one shape");
  return mx::array(gate.shape(), mx::float32, std::make_shared<Swiglu>(cpu_stream(), threads), {gate, up});
}

// Positions start at `offset`, or, when `offsets` is given, at its one integer or its one per
// batch entry.
mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale, int64_t offset,
               std::optional<mx::array> offsets, std::optional<mx::array> freqs) {
  if ((x.ndim() != 3 && x.ndim() != 4) || x.dtype() != mx::float32 || dims <= 0 || dims % 2 || dims > x.shape(-1) ||
      (freqs && (freqs->ndim() != 1 || freqs->shape(0) != dims / 2)))
    throw std::invalid_argument("rope shapes or dtypes the kernel does not take");
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{x};
  if (offsets) {
    if (offsets->ndim() > 1 || (offsets->size() != 1 && offsets->size() != x.shape(0)) ||
        !mx::issubdtype(offsets->dtype(), mx::integer))
      throw std::invalid_argument("rope offsets the kernel does not take (one integer per batch entry)");
    inputs.push_back(plain(*offsets, mx::int32, s));
  }
  if (freqs) inputs.push_back(plain(*freqs, mx::float32, s));
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<Rope>(s, dims, traditional, base, scale, offsets ? 0 : offset,
                                          offsets.has_value(), freqs.has_value()),
                   std::move(inputs));
}

}  // namespace

void register_tiled(nb::module_& m);  // tiled.cpp

NB_MODULE(_brisk_mlx_ops, m) {
  m.doc() = "Brisk's native CPU kernels as lazy MLX primitives (kernels/mlx_extension.py builds this)";
  m.def("quantized_matmul", &quantized_matmul, nb::arg("x"), nb::arg("weight"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("bias").none(), nb::arg("bits"), nb::arg("group_size"), nb::arg("scale_type"),
        nb::arg("threads"), nb::arg("integer_activations"));
  m.def("quantized_gather", &quantized_gather, nb::arg("ids"), nb::arg("weight"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("bits"), nb::arg("group_size"), nb::arg("scale_type"));
  m.def("skinny_matmul", &skinny_matmul, nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("threads"), nb::arg("wide") = false);
  m.def("float_gemm_available", [] { return brisk_float_gemm_available() != 0; });
  m.def("attention", &attention, nb::arg("queries"), nb::arg("keys"), nb::arg("values"), nb::arg("scale"),
        nb::arg("causal"), nb::arg("sinks").none(), nb::arg("length").none(), nb::arg("threads"),
        nb::arg("coarse") = false);
  m.def("packed_attention", &packed_attention, nb::arg("queries"), nb::arg("keys"), nb::arg("kv_heads"),
        nb::arg("scale"), nb::arg("causal"), nb::arg("threads"), nb::arg("k_meta"), nb::arg("k_data").none(),
        nb::arg("k_scales").none(), nb::arg("k_biases").none(), nb::arg("k_dense").none(),
        nb::arg("k_limits").none(), nb::arg("v_meta"), nb::arg("v_data").none(), nb::arg("v_scales").none(),
        nb::arg("v_biases").none(), nb::arg("v_dense").none());
  m.def("rms_norm", &rms_norm, nb::arg("x"), nb::arg("weight"), nb::arg("eps"));
  m.def("swiglu", &swiglu, nb::arg("gate"), nb::arg("up"), nb::arg("threads"));
  m.def("sample_softmax", &sample_softmax, nb::arg("logits"), nb::arg("uniforms"), nb::arg("inv_temperature"));
  m.def("pooled_attention_max", &pooled_attention_max, nb::arg("logits"), nb::arg("visible_first"), nb::arg("start"),
        nb::arg("end"), nb::arg("kernel"), nb::arg("threads"));
  m.def("rope", &rope, nb::arg("x"), nb::arg("dims"), nb::arg("traditional"), nb::arg("base"), nb::arg("scale"),
        nb::arg("offset"), nb::arg("offsets").none(), nb::arg("freqs").none());
  m.def("has_sgemm", [] { return brisk_quantized_matmul_has_sgemm() != 0; });
  register_tiled(m);
  m.def("version", [] { return 14; });
}
