// The native CPU kernels as lazy MLX primitives: nodes of MLX's graph, evaluated with the
// rest of it on the CPU stream.
//
// Called through ctypes, a kernel must evaluate its inputs first: a decode step of a
// 30-layer model then synchronises with MLX about 210 times and copies each output back
// into a fresh array, and that cost SmolLM2's 4-bit decode more than the kernels' own
// time (shared/CPU.md, issue 17). As primitives the kernels only enqueue work.
//
// The kernels themselves are the extern "C" functions of ../quantized_matmul.cpp and
// ../skinny_matmul.cpp, compiled into this module; kernels/mlx_extension.py builds it
// against the installed mlx wheel's headers and libmlx, with nanobind in MLX's domain so
// the functions take and return mlx.core.array. The Python side checks every shape,
// dtype and format before building a node: a node is only made for calls the kernel
// takes, so eval_cpu never has to decline.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/variant.h>

#include <array>
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

extern "C" {
int brisk_quantized_matmul_rows(const float*, const uint32_t*, const void*, const void*, int, const float*, float*,
                                int, int, int, int, int, int, int);
int brisk_quantized_matmul_dense(const float*, const uint32_t*, const void*, const void*, int, const float*, float*,
                                 int, int, int, int, int, int);
int brisk_quantized_gather(const int32_t*, int, const uint32_t*, const void*, const void*, int, float*, int, int,
                           int, int);
int brisk_quantized_matmul_has_sgemm();
int brisk_skinny_matmul(const float*, const float*, const float*, float*, int, int, int, int);
int brisk_attention(const float*, const float*, const float*, float*, int, int, int, int, int, int, const int64_t*,
                    const int64_t*, float, int, const float*, int);
}

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

constexpr int kMaxFewRows = 16;  // the few-row kernels' limit (quantized_matmul.cpp, skinny_matmul.cpp)

int64_t leading_rows(const mx::array& x) { return x.ndim() == 0 ? 1 : x.size() / x.shape(-1); }

mx::Shape with_last(const mx::array& x, int last) {
  mx::Shape shape = x.shape();
  shape.back() = last;
  return shape;
}

void allocate(mx::array& out) { out.set_data(mx::allocator::malloc(out.nbytes())); }

// The kernels read plain row-major buffers: a strided view is copied first (lazily).
mx::array plain(const mx::array& a, mx::Dtype dtype, const mx::Stream& s) {
  return mx::contiguous(mx::astype(a, dtype, s), false, s);
}

// A weight already in memory as a strided view would be copied on every call, which costs
// more than the kernel saves: the caller keeps MLX's matmul (ValueError in Python).
void require_plain_weight(const mx::array& w) {
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

// y = x @ dequantize(w).T (+ bias), x float32 (..., K), w MLX affine-quantized (N, K).
class QuantizedMatmul : public CpuPrimitive {
 public:
  QuantizedMatmul(mx::Stream s, int bits, int group, int scale_type, int threads, bool has_bias, bool integer_x)
      : CpuPrimitive(s), bits_(bits), group_(group), scale_type_(scale_type), threads_(threads),
        has_bias_(has_bias), integer_x_(integer_x) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &x = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int M = int(leading_rows(x)), K = int(x.shape(-1)), N = int(w.shape(0));
    encoder.dispatch([x = x.data<float>(), w = w.data<uint32_t>(), s = scales.data<void>(),
                      b = biases.data<void>(), bias = has_bias_ ? inputs[4].data<float>() : nullptr,
                      y = out.data<float>(), M, K, N, bits = bits_, group = group_, type = scale_type_,
                      threads = threads_, integer_x = int(integer_x_)]() {
      const int code = M <= kMaxFewRows
                           ? brisk_quantized_matmul_rows(x, w, s, b, type, bias, y, M, K, N, bits, group, threads, integer_x)
                           : brisk_quantized_matmul_dense(x, w, s, b, type, bias, y, M, K, N, bits, group, threads);
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
  bool has_bias_, integer_x_;
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

// y = x @ w.T (+ bias) for float32 x with 1-16 rows and float32 w (N, K): the verify pass.
class SkinnyMatmul : public CpuPrimitive {
 public:
  SkinnyMatmul(mx::Stream s, int threads, bool has_bias) : CpuPrimitive(s), threads_(threads), has_bias_(has_bias) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &x = inputs[0], &w = inputs[1];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int M = int(leading_rows(x)), K = int(x.shape(-1)), N = int(w.shape(0));
    encoder.dispatch([x = x.data<float>(), w = w.data<float>(), bias = has_bias_ ? inputs[2].data<float>() : nullptr,
                      y = out.data<float>(), M, K, N, threads = threads_]() {
      if (brisk_skinny_matmul(x, w, bias, y, M, K, N, threads))
        throw std::runtime_error("brisk skinny matmul declined");
    });
  }

  const char* name() const override { return "BriskSkinnyMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const SkinnyMatmul&>(other);
    return threads_ == o.threads_ && has_bias_ == o.has_bias_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {with_last(inputs[0], int(inputs[1].shape(0)))};
  }

 private:
  int threads_;
  bool has_bias_;
};

// softmax(q k^T * scale) v for float32 q (B, Hq, L, D), k and v (B, Hkv, S, D); causal puts
// query i at position S - L + i (MLX's "causal"). Keys and values are read in place through
// their strides (a KV cache's sliced views), rows copied only if a row itself is strided.
class Attention : public CpuPrimitive {
 public:
  Attention(mx::Stream s, float scale, bool causal, bool has_sinks, int threads)
      : CpuPrimitive(s), scale_(scale), causal_(causal), has_sinks_(has_sinks), threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& q = inputs[0];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int B = int(q.shape(0)), Hq = int(q.shape(1)), L = int(q.shape(2)), D = int(q.shape(3));
    const int Hkv = int(inputs[1].shape(1)), S = int(inputs[1].shape(2));
    View k = view(inputs[1], encoder), v = view(inputs[2], encoder);
    const float* sinks = has_sinks_ ? inputs[3].data<float>() : nullptr;
    encoder.dispatch([q = q.data<float>(), k, v, sinks, y = out.data<float>(), B, Hq, Hkv, L, S, D, scale = scale_,
                      causal = causal_, threads = threads_]() {
      k.gather_rows();
      v.gather_rows();
      if (brisk_attention(q, k.data(), v.data(), y, B, Hq, Hkv, L, S, D, k.strides.data(), v.strides.data(), scale,
                          causal, sinks, threads))
        throw std::runtime_error("brisk attention declined its shapes");
    });
  }

  const char* name() const override { return "BriskAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Attention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && has_sinks_ == o.has_sinks_ && threads_ == o.threads_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  // Keys or values as the kernel reads them: in place through their strides, or, when a row
  // itself is strided (rare: a transposed cache), gathered into a contiguous copy on the
  // stream just before the kernel runs.
  struct View {
    const float* source;
    float* copy = nullptr;
    mx::Shape shape;
    mx::Strides source_strides;
    std::array<int64_t, 3> strides;

    const float* data() const { return copy ? copy : source; }
    void gather_rows() const {
      if (!copy) return;
      int64_t i = 0;
      const auto& st = source_strides;
      for (int b = 0; b < shape[0]; ++b)
        for (int h = 0; h < shape[1]; ++h)
          for (int p = 0; p < shape[2]; ++p)
            for (int d = 0; d < shape[3]; ++d) copy[i++] = source[b * st[0] + h * st[1] + p * st[2] + d * st[3]];
    }
  };

  static View view(const mx::array& a, mx::cpu::CommandEncoder& encoder) {
    View v{a.data<float>(), nullptr, a.shape(), a.strides(), {a.strides()[0], a.strides()[1], a.strides()[2]}};
    if (a.strides().back() != 1 && a.shape(-1) != 1) {
      mx::array copy(a.shape(), mx::float32, nullptr, {});
      allocate(copy);
      v.copy = copy.data<float>();
      v.strides = {int64_t(a.shape(1)) * a.shape(2) * a.shape(3), int64_t(a.shape(2)) * a.shape(3), a.shape(3)};
      encoder.add_temporary(std::move(copy));  // freed once the task has run
    }
    return v;
  }

  float scale_;
  bool causal_, has_sinks_;
  int threads_;
};

mx::Stream cpu_stream() { return mx::default_stream(mx::Device::cpu); }

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                           std::optional<mx::array> bias, int bits, int group, int scale_type, int threads,
                           bool integer_x) {
  require_plain_weight(w);
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{plain(x, mx::float32, s), plain(w, mx::uint32, s), plain(scales, scales.dtype(), s),
                                plain(biases, biases.dtype(), s)};
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

mx::array skinny_matmul(const mx::array& x, const mx::array& w, std::optional<mx::array> bias, int threads) {
  require_plain_weight(w);
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{plain(x, mx::float32, s), plain(w, mx::float32, s)};
  if (bias) inputs.push_back(plain(*bias, mx::float32, s));
  auto shape = with_last(x, int(w.shape(0)));
  return mx::array(std::move(shape), mx::float32, std::make_shared<SkinnyMatmul>(s, threads, bias.has_value()),
                   std::move(inputs));
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    std::optional<mx::array> sinks, int threads) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || k.shape() != v.shape() || q.shape(0) != k.shape(0) ||
      q.shape(3) != k.shape(3) || q.shape(1) % k.shape(1) || q.shape(3) % 8 || q.shape(3) > 256 ||
      q.shape(2) > k.shape(2) || q.shape(2) < 1 || q.shape(1) / k.shape(1) > 64)
    throw std::invalid_argument("attention shapes the kernel does not take");
  if (sinks && (sinks->ndim() != 1 || sinks->shape(0) != q.shape(1)))
    throw std::invalid_argument("attention sinks of a shape the kernel does not take (one per query head)");
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{plain(q, mx::float32, s), mx::astype(k, mx::float32, s),
                                mx::astype(v, mx::float32, s)};
  if (sinks) inputs.push_back(plain(*sinks, mx::float32, s));
  return mx::array(q.shape(), mx::float32,
                   std::make_shared<Attention>(s, scale, causal, sinks.has_value(), threads), std::move(inputs));
}

}  // namespace

NB_MODULE(_brisk_mlx_ops, m) {
  m.doc() = "Brisk's native CPU kernels as lazy MLX primitives (kernels/mlx_extension.py builds this)";
  m.def("quantized_matmul", &quantized_matmul, nb::arg("x"), nb::arg("weight"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("bias").none(), nb::arg("bits"), nb::arg("group_size"), nb::arg("scale_type"),
        nb::arg("threads"), nb::arg("integer_activations"));
  m.def("quantized_gather", &quantized_gather, nb::arg("ids"), nb::arg("weight"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("bits"), nb::arg("group_size"), nb::arg("scale_type"));
  m.def("skinny_matmul", &skinny_matmul, nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("threads"));
  m.def("attention", &attention, nb::arg("queries"), nb::arg("keys"), nb::arg("values"), nb::arg("scale"),
        nb::arg("causal"), nb::arg("sinks").none(), nb::arg("threads"));
  m.def("has_sgemm", [] { return brisk_quantized_matmul_has_sgemm() != 0; });
  m.def("version", [] { return 2; });
}
