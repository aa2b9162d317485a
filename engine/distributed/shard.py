"""Split a loaded model across the ranks of a group: tensor parallelism.

mlx-lm's own `shard` method (llama, qwen2, qwen3, ... : every model class that has one)
splits each layer's attention heads and MLP columns: q/k/v and gate/up are cut by output
rows, o_proj and down_proj by input columns and summed across ranks (two all_sums per layer
per forward). Each rank then holds 1/N of the layers' weights and, since its attention
keeps 1/N of the KV heads, 1/N of the KV cache.

mlx-lm leaves the embedding and output head whole on every rank: a third of a 0.5B model
(151,936 x 896), which would keep each rank above half the weights. They are cut here by
vocabulary rows too: a lookup sums each rank's rows (tokens outside a rank's rows read
zero), and the head's logits are the ranks' slices gathered end to end.

Pipeline (layer) parallelism is not used: mlx-lm's keeps the embeddings and head whole on
every stage, runs one stage at a time for a single sequence, and places the last layers on
rank 0, so it saves less memory and no time for one chat; its one advantage, fewer and
larger messages over a slow link, is written down in the package's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers import distributed as mxd
from mlx.utils import tree_flatten, tree_map

from brisk.engine.api.errors import BriskError


class ShardingRefused(BriskError):
    """This model cannot be split across these ranks (said before any weight is read)."""

    kind = "unsupported_model"  # the request's fault, not the server's: a 400, not a 500


@dataclass
class ShardReport:
    """What one rank holds: its weight bytes and the whole model's, in the loaded dtypes."""

    rank: int
    size: int
    weight_bytes: int
    model_weight_bytes: int
    resident_weight_bytes: int = 0  # after the compute-dtype cast (float32 on a CPU)

    @property
    def share(self) -> float:
        return self.weight_bytes / self.model_weight_bytes if self.model_weight_bytes else 0.0


def check_shardable(model: nn.Module | type, config: dict, size: int) -> None:
    """Refuse, in one line, a model (or model class) whose architecture or shapes cannot be
    split `size` ways."""
    arch = config.get("model_type", "?")
    if not hasattr(model, "shard"):
        raise ShardingRefused(
            f"{arch} models cannot run on several ranks: mlx-lm has tensor parallelism (a `shard` method) "
            "for llama, qwen2, qwen3, qwen3_moe, deepseek, glm4_moe, gpt_oss, minimax and a few more, not for "
            f"{arch}"
        )
    heads = int(config.get("num_attention_heads") or 0)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    inter = int(config.get("intermediate_size") or 0)
    uneven = [
        f"{name} {value}"
        for name, value in (("attention heads", heads), ("KV heads", kv_heads), ("MLP width", inter))
        if value and value % size
    ]
    if uneven:
        raise ShardingRefused(f"{config.get('model_type', '?')} cannot be split {size} ways: {', '.join(uneven)}")


def weight_bytes(model: nn.Module) -> int:
    leaves = cast(list, tree_flatten(model.parameters()))
    return sum(int(value.nbytes) for _, value in leaves)


class VocabShardedEmbedding(nn.Module):
    """One rank's rows of an embedding table (plain or quantized): lookups summed across
    ranks, `as_linear` (a tied head) gathered across ranks."""

    def __init__(self, inner: nn.Module, start: int, rows: int, group: mx.distributed.Group):
        super().__init__()
        self.inner = inner
        self.start, self.rows = start, rows
        self.group = group

    def __call__(self, ids: mx.array) -> mx.array:
        local = ids.astype(mx.int32) - self.start
        mine = (local >= 0) & (local < self.rows)
        rows = self.inner(mx.where(mine, local, 0))
        return mx.distributed.all_sum(rows * mine[..., None].astype(rows.dtype), group=self.group)

    def as_linear(self, x: mx.array) -> mx.array:
        return gather_vocab(self.inner.as_linear(x), self.group)


class VocabShardedHead(nn.Module):
    """An untied output head cut by vocabulary rows; the logits gathered across ranks."""

    def __init__(self, inner: nn.Module, group: mx.distributed.Group):
        super().__init__()
        self.inner = inner
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        return gather_vocab(self.inner(x), self.group)


class SumAcrossRanks(nn.Module):
    """A layer cut by input columns: this rank's partial product, summed across ranks,
    then the bias once (mlx's ShardedToAllLinear, with a plain layer inside)."""

    def __init__(self, inner: nn.Module, bias: mx.array | None, group: mx.distributed.Group):
        super().__init__()
        self.inner = inner
        if bias is not None:
            self.bias = bias
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        y = mx.distributed.all_sum(self.inner(x), group=self.group)
        return y + self["bias"] if "bias" in self else y


def _is_module(value) -> bool:
    return isinstance(value, nn.Module)


def _plain(sharded: nn.Module, with_bias: bool) -> nn.Module:
    """The nn.Linear or nn.QuantizedLinear holding a sharded layer's local arrays: Brisk's
    native kernels replace layers by their exact type (kernels/native_layers.py), and MLX's
    own CPU products for 5-bit weights are ~100x slower. Built without __init__, which
    would draw random weights (and move the global random state)."""
    quantized = "scales" in sharded
    cls = nn.QuantizedLinear if quantized else nn.Linear
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.weight = sharded["weight"]
    if quantized:
        layer.group_size, layer.bits, layer.mode = sharded.group_size, sharded.bits, sharded.mode
        layer.scales = sharded["scales"]
        layer.biases = sharded.get("biases")
    if with_bias and "bias" in sharded:
        layer.bias = sharded["bias"]
    if quantized:
        layer.freeze()
    return layer


def as_local_layer(module: nn.Module, group: mx.distributed.Group) -> nn.Module:
    """mlx's sharded linear layers as plain local layers (+ the all_sum where one is due);
    anything else unchanged."""
    if isinstance(module, (mxd.AllToShardedLinear, mxd.QuantizedAllToShardedLinear)):
        return _plain(module, with_bias=True)  # its input is whole: no collective in the forward
    if isinstance(module, (mxd.ShardedToAllLinear, mxd.QuantizedShardedToAllLinear)):
        return SumAcrossRanks(_plain(module, with_bias=False), module.get("bias"), group)
    return module


def gather_vocab(part: mx.array, group: mx.distributed.Group) -> mx.array:
    """Each rank's logits for its vocabulary slice, joined in rank order (all_gather
    concatenates along the first axis, so the vocabulary axis goes there and back)."""
    joined = mx.distributed.all_gather(mx.moveaxis(part, -1, 0), group=group)
    return mx.moveaxis(joined, 0, -1)


def _row_slice(module: nn.Module, start: int, rows: int) -> nn.Module:
    """`module` (Embedding, QuantizedEmbedding or Linear) keeping rows [start, start+rows)
    of each parameter whose first axis is the vocabulary."""
    vocab = module["weight"].shape[0]
    for name in ("weight", "scales", "biases", "bias"):
        if name in module and module[name] is not None and module[name].shape[0] == vocab:
            module[name] = module[name][start : start + rows]
    if hasattr(module, "num_embeddings"):
        module.num_embeddings = rows
    return module


def shard_vocab(model: nn.Module, config: dict, group: mx.distributed.Group) -> bool:
    """Cut the embedding (and an untied head) by vocabulary rows; False (left whole) where
    the vocabulary does not divide evenly."""
    body = getattr(model, "model", None)
    embed = getattr(body, "embed_tokens", None)
    if body is None or embed is None or "weight" not in embed:
        return False
    vocab, size, rank = embed["weight"].shape[0], group.size(), group.rank()
    if vocab % size:
        return False
    rows = vocab // size
    start = rank * rows
    body.embed_tokens = VocabShardedEmbedding(_row_slice(embed, start, rows), start, rows, group)
    head = getattr(model, "lm_head", None) if "lm_head" in model else None
    if head is not None and head["weight"].shape[0] == vocab:
        model.lm_head = VocabShardedHead(_row_slice(head, start, rows), group)
    return True


def shard_model(model: nn.Module, config: dict, group: mx.distributed.Group, *, model_bytes: int) -> ShardReport:
    """Tensor-parallel split of a lazily loaded `model` across `group` (nothing is read
    from disk but this rank's slices when the caller evaluates the parameters)."""
    size = group.size()
    check_shardable(model, config, size)
    try:
        model.shard(group)
    except (ValueError, AssertionError) as exc:  # mlx's own shape checks (quantization groups)
        raise ShardingRefused(f"{config.get('model_type', '?')} cannot be split {size} ways: {exc}") from exc
    shard_vocab(model, config, group)
    model.update_modules(tree_map(lambda m: as_local_layer(m, group), model.leaf_modules(), is_leaf=_is_module))
    local = weight_bytes(model)
    return ShardReport(group.rank(), size, local, model_bytes, local)
