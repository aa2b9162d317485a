"""Projections that read the same input run as one product: q, k and v; gate and up.

A decode step of a 4-bit model is bound by per-call cost more than by bytes (SmolLM2: 30
layers of 7 products of a few hundred columns each). Each native call rounds x to integers
(kernels/quantized_matmul.py) and wakes the thread pool; q, k and v do that three times for
one x. Fused, their packed rows are concatenated (no copy kept of the parts) and one call
gives all three outputs (decode-sized x only: prefill's parts run alone, on views of the
fused rows).

`fuse_shared_input_projections(model)` replaces each such group of NativeQuantizedLinear
layers (same bits, group size, scale dtype and bias or none: mixed imports keep them apart)
by `ProjectionPart`s of one `FusedProjections` module, which the attention or MLP module
holds as a child (so its arrays are the model's parameters once). The first part called with
an x computes every part's output; the others take theirs from it. Each output column is
computed exactly as the separate layer computed it, so logits are unchanged bit for bit.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
import mlx.nn as nn

from kernels.quantized_matmul import MAX_FEW_ROWS, NativeQuantizedLinear, quantized_matmul

GROUPS = {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}


class FusedProjections(NativeQuantizedLinear):
    """The parts' rows as one quantized linear layer, and the last x's outputs per part."""

    def __init__(self, parts: list[NativeQuantizedLinear]):
        nn.Module.__init__(self)
        first = parts[0]
        self.group_size, self.bits, self.mode = first.group_size, first.bits, getattr(first, "mode", "affine")
        for name in ("weight", "scales", "biases", "bias"):
            if name in first:
                self[name] = mx.concatenate([part[name] for part in parts])
        self.__dict__["_route"] = first._route
        self.__dict__["_sizes"] = [part["weight"].shape[0] for part in parts]
        self.__dict__["_last"] = None  # (x, outputs, parts not yet handed out)
        self.freeze()
        mx.eval(self.parameters())  # concatenated now: the parts' own arrays can go
        # Each part's rows as views of the fused arrays (no copy), for prefill-sized x.
        views, at = [], 0
        for size in self._sizes:
            views.append(
                {name: self[name][at : at + size] for name in ("weight", "scales", "biases", "bias") if name in self}
            )
            at += size
        mx.eval(views)
        self.__dict__["_views"] = views

    def part(self, index: int, x: mx.array) -> mx.array:
        if x.size // x.shape[-1] > MAX_FEW_ROWS:  # prefill: one product over 512 rows and 3072
            return self._alone(index, x)  # columns ran 1.6x slower than two of 1536 (AMX path)
        last = self.__dict__["_last"]
        if last is None or last[0] is not x or index not in last[2]:
            splits, at = [], 0
            for size in self._sizes[:-1]:
                at += size
                splits.append(at)
            last = (x, mx.split(self(x), splits, axis=-1), set(range(len(self._sizes))))
        last[2].discard(index)
        # once every part has its output, let go of x and the outputs (a prefill chunk's are MBs)
        self.__dict__["_last"] = last if last[2] else None
        return last[1][index]

    def _alone(self, index: int, x: mx.array) -> mx.array:
        view = self._views[index]
        return quantized_matmul(
            x, view["weight"], view["scales"], view.get("biases"), bits=self.bits, group_size=self.group_size,
            bias=view.get("bias"), native_ok=self._route.native,
        )  # fmt: skip


class ProjectionPart(nn.Module):
    """Stands where one of the fused layers stood; holds no arrays of its own."""

    def __init__(self, fused: FusedProjections, index: int):
        super().__init__()
        self.__dict__["_fused"], self.__dict__["_index"] = fused, index

    def __call__(self, x: mx.array) -> mx.array:
        return self._fused.part(self._index, x)


def _fusable(layers: list) -> bool:
    first = layers[0]
    if not all(type(layer) is NativeQuantizedLinear for layer in layers):
        return False
    if getattr(first, "mode", "affine") != "affine":
        return False
    same = ("bits", "group_size")
    return all(
        all(getattr(layer, a) == getattr(first, a) for a in same)
        and layer["scales"].dtype == first["scales"].dtype
        and ("bias" in layer) == ("bias" in first)
        and ("biases" in layer) == ("biases" in first)
        and layer["weight"].shape[1] == first["weight"].shape[1]
        for layer in layers
    )


def fuse_shared_input_projections(model) -> int:
    """Fuse each decoder layer's q/k/v and gate/up groups; returns how many groups were fused."""
    fused = 0
    for block in getattr(getattr(model, "model", model), "layers", []):
        for holder_name, names in GROUPS.items():
            holder = getattr(block, holder_name, None)
            layers = [getattr(holder, name, None) for name in names]
            if holder is None or any(layer is None for layer in layers) or not _fusable(layers):
                continue
            group = FusedProjections(cast(list[NativeQuantizedLinear], layers))
            holder["fused_" + "_".join(n.split("_")[0] for n in names)] = group
            for index, name in enumerate(names):
                holder[name] = ProjectionPart(group, index)
            fused += 1
    return fused
