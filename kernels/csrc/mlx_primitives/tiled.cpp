// The column-tiled quantized kernels of ../tiled_matmul.cpp as lazy MLX primitives:
// the product, the embedding lookup and the repack of a weight into tiles (a model's
// load runs it once per layer, and the new array takes the old one's place).
// kernels/tiled_matmul.py checks every shape, dtype and format before building a node.

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "primitive_base.h"

extern "C" {
int brisk_tiled_available();
int brisk_tiled_repack(const uint8_t*, uint8_t*, int, int, int, int);
int brisk_tiled_matmul(const float*, const uint8_t*, const void*, const void*, int, const float*, float*, int, int,
                       int, int, int, int, int);
int brisk_tiled_gather(const int32_t*, int, const uint8_t*, const void*, const void*, int, float*, int, int, int,
                       int);
}

namespace nb = nanobind;
using namespace brisk_primitives;

namespace {

// y = x @ dequantize(w).T (+ bias), x float32 (..., K), w tiled (N, K).
class TiledMatmul : public CpuPrimitive {
 public:
  TiledMatmul(mx::Stream s, int bits, int group, int scale_type, int threads, bool has_bias, bool coarse)
      : CpuPrimitive(s), bits_(bits), group_(group), scale_type_(scale_type), threads_(threads), has_bias_(has_bias),
        coarse_(coarse) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &x = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int M = int(leading_rows(x)), K = int(x.shape(-1)), N = int(w.shape(0));
    encoder.dispatch([xs = row_major(x, encoder), w = w.data<uint8_t>(), s = scales.data<void>(),
                      b = biases.data<void>(), bias = has_bias_ ? inputs[4].data<float>() : nullptr,
                      y = out.data<float>(), M, K, N, bits = bits_, group = group_, type = scale_type_,
                      threads = threads_, coarse = coarse_]() {
      xs.gather();
      const int code = brisk_tiled_matmul(xs.data(), w, s, b, type, bias, y, M, K, N, bits, group, threads, coarse);
      if (code) throw std::runtime_error("brisk tiled matmul declined (code " + std::to_string(code) + ")");
    });
  }

  const char* name() const override { return "BriskTiledMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const TiledMatmul&>(other);
    return bits_ == o.bits_ && group_ == o.group_ && scale_type_ == o.scale_type_ && threads_ == o.threads_ &&
           has_bias_ == o.has_bias_ && coarse_ == o.coarse_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {with_last(inputs[0], int(inputs[1].shape(0)))};
  }

 private:
  int bits_, group_, scale_type_, threads_;
  bool has_bias_, coarse_;
};

// Rows `ids` of a tiled (V, K) table, dequantized to float32.
class TiledGather : public CpuPrimitive {
 public:
  TiledGather(mx::Stream s, int bits, int group, int scale_type)
      : CpuPrimitive(s), bits_(bits), group_(group), scale_type_(scale_type) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array &ids = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int count = int(ids.size()), V = int(w.shape(0)), K = int(out.shape(-1));
    encoder.dispatch([ids = ids.data<int32_t>(), w = w.data<uint8_t>(), s = scales.data<void>(),
                      b = biases.data<void>(), y = out.data<float>(), count, V, K, bits = bits_, group = group_,
                      type = scale_type_]() {
      if (brisk_tiled_gather(ids, count, w, s, b, type, y, V, K, bits, group))
        throw std::out_of_range("brisk tiled embedding: a token id outside the vocabulary");
    });
  }

  const char* name() const override { return "BriskTiledGather"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const TiledGather&>(other);
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

// An MLX-layout quantized weight (N, K * bits / 32) in the tiled layout: same shape and dtype.
class TiledRepack : public CpuPrimitive {
 public:
  TiledRepack(mx::Stream s, int bits, int threads) : CpuPrimitive(s), bits_(bits), threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const mx::array& w = inputs[0];
    mx::array& out = outputs[0];
    auto& encoder = prepare(inputs, out);
    const int N = int(w.shape(0)), K = int(w.shape(1)) * 32 / bits_;
    encoder.dispatch([w = w.data<uint8_t>(), y = out.data<uint8_t>(), N, K, bits = bits_, threads = threads_]() {
      if (brisk_tiled_repack(w, y, N, K, bits, threads)) throw std::runtime_error("brisk tiled repack declined");
    });
  }

  const char* name() const override { return "BriskTiledRepack"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const TiledRepack&>(other);
    return bits_ == o.bits_ && threads_ == o.threads_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  int bits_, threads_;
};

mx::array tiled_matmul(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                       std::optional<mx::array> bias, int bits, int group, int scale_type, int threads, bool coarse) {
  require_plain_weight(w);
  const auto s = cpu_stream();
  std::vector<mx::array> inputs{mx::astype(x, mx::float32, s), plain(w, mx::uint32, s),
                                plain(scales, scales.dtype(), s), plain(biases, biases.dtype(), s)};
  if (bias) inputs.push_back(plain(*bias, mx::float32, s));
  auto shape = with_last(x, int(w.shape(0)));
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<TiledMatmul>(s, bits, group, scale_type, threads, bias.has_value(), coarse),
                   std::move(inputs));
}

mx::array tiled_gather(const mx::array& ids, const mx::array& w, const mx::array& scales, const mx::array& biases,
                       int bits, int group, int scale_type) {
  const auto s = cpu_stream();
  mx::Shape shape = ids.shape();
  shape.push_back(int(w.shape(1)) * 32 / bits);
  return mx::array(std::move(shape), mx::float32, std::make_shared<TiledGather>(s, bits, group, scale_type),
                   {plain(ids, mx::int32, s), plain(w, mx::uint32, s), plain(scales, scales.dtype(), s),
                    plain(biases, biases.dtype(), s)});
}

mx::array tiled_repack(const mx::array& w, int bits, int threads) {
  if (w.ndim() != 2 || w.dtype() != mx::uint32 || w.shape(0) % 16 || (int64_t(w.shape(1)) * 32 / bits) % 32)
    throw std::invalid_argument("a weight the tiled layout does not take");
  const auto s = cpu_stream();
  return mx::array(w.shape(), mx::uint32, std::make_shared<TiledRepack>(s, bits, threads), {plain(w, mx::uint32, s)});
}

}  // namespace

void register_tiled(nb::module_& m) {
  m.def("tiled_matmul", &tiled_matmul, nb::arg("x"), nb::arg("weight"), nb::arg("scales"), nb::arg("biases"),
        nb::arg("bias").none(), nb::arg("bits"), nb::arg("group_size"), nb::arg("scale_type"), nb::arg("threads"),
        nb::arg("coarse") = false);
  m.def("tiled_gather", &tiled_gather, nb::arg("ids"), nb::arg("weight"), nb::arg("scales"), nb::arg("biases"),
        nb::arg("bits"), nb::arg("group_size"), nb::arg("scale_type"));
  m.def("tiled_repack", &tiled_repack, nb::arg("weight"), nb::arg("bits"), nb::arg("threads"));
  m.def("tiled_available", [] { return brisk_tiled_available() != 0; });
}
