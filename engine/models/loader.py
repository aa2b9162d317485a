"""Load an installed model for inference, verified first, in the compute dtype."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from brisk.engine.api.errors import BrokenModelFolder
from brisk.engine.models.folder import FolderInfo, inspect_folder, read_config
from brisk.engine.models.store import ModelStore

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    id: str
    path: Path
    model: Any  # mlx.nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    config: dict
    info: FolderInfo
    compute_dtype: str

    @property
    def context_length(self) -> int:
        return self.info.context_length


def compute_dtype_name() -> str:
    """The kernel plan's: float32 where the CPU kernels run (half-precision matmuls are ~40x
    slower on MLX's CPU: shared/CPU.md), the stored dtype on a GPU (kernels/plan.py)."""
    from brisk.kernels import plan

    return plan.current().compute_dtype


def to_float32(model) -> None:
    """Float parameters to float32, except quantized layers' scales and biases: they stay as
    stored (float16 for a GGUF import), which the kernels read, and take half the memory."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    def cast(path: str, value):
        quantizer = path.endswith((".scales", ".biases"))
        return value if quantizer or not mx.issubdtype(value.dtype, mx.floating) else value.astype(mx.float32)

    model.update(tree_map_with_path(cast, model.parameters()))
    mx.eval(model.parameters())


def load_folder(path: Path, *, model_id: str | None = None) -> LoadedModel:
    from mlx_lm.utils import load

    from brisk.engine.runtime.mlx_hooks import check_hooks
    from brisk.kernels import plan
    from brisk.kernels.activation import use_native_activation
    from brisk.kernels.fused_attention import use_fused_attention
    from brisk.kernels.native_layers import use_native_layers
    from brisk.kernels.tiled_matmul import use_tiled_layers

    check_hooks()  # an mlx-lm that moved a hook is named here, not as a wrong answer later
    rank = distributed_rank()  # a rank of `brisk run --ranks N` reads only its shard of the weights
    path = Path(path)
    info = inspect_folder(path)  # names the problem before mlx-lm can fail obscurely
    config = read_config(path)
    try:
        # Never run code from the folder, whatever transformers' default becomes.
        loaded = load(
            str(path), tokenizer_config={"trust_remote_code": False}, trust_remote_code=False, lazy=rank is not None
        )
        model, tokenizer = loaded[0], loaded[1]
    except Exception as exc:  # anything mlx-lm or transformers raise here is about this folder
        raise BrokenModelFolder(f"{path.name} cannot be loaded by mlx-lm: {exc}") from exc
    if rank is not None:
        from brisk.engine.distributed.loading import shard_loaded

        shard_loaded(model, config, rank)  # before the native kernels: they keep to unsplit layers
    dtype = compute_dtype_name()
    if dtype == "float32":
        to_float32(model)
    # float attention (packed KV caches keep their kernel); MLX's own where the plan has no
    # kernel, through the function the compiled decode step needs (engine/decode/compiled.py)
    fused = use_fused_attention(model)
    if plan.current().native:
        swapped = use_native_layers(model)  # quantized layers and few-row float products
        tiled = use_tiled_layers(model)  # quantized layers repacked for VNNI-512, where the CPU has it
        activation = use_native_activation(model)  # SwiGLU's silu(gate) * x
        log.debug(
            "%s: %d layers run on the native kernels (%d in column tiles), attention fused in %d modules, "
            "SwiGLU native in %d",
            path.name,
            swapped,
            tiled,
            fused,
            activation,
        )
        _warn_without_primitives()
    if rank is not None:
        from brisk.engine.distributed.loading import note_resident

        note_resident(model, rank)
    if not tokenizer.eos_token_ids:
        log.warning("%s defines no end-of-sequence token: answers stop only at max_tokens", path.name)
    return LoadedModel(model_id or path.name, path, model, tokenizer, config, info, dtype)


def distributed_rank():
    """This process's rank when it is one of a distributed run's (engine/distributed), else None."""
    from brisk.engine.distributed.group import current

    return current()


@lru_cache(maxsize=1)
def _warn_without_primitives() -> None:
    """Once per process: without the MLX primitives, decode runs at a third to a half of its
    speed (ctypes calls evaluate per layer; attention, RMSNorm and RoPE stay MLX's)."""
    import mlx.core as mx

    from brisk.kernels import mlx_extension

    reason = mlx_extension.unavailable_reason()
    if reason is not None and not reason.startswith("turned off") and mx.default_device() == mx.cpu:
        log.warning(
            "Brisk's native kernels run without their MLX primitives (%s): decode is 2-3x slower. "
            "`brisk info` shows what is missing.",
            reason,
        )


def load_model(model_id: str, *, store: ModelStore | None = None) -> LoadedModel:
    store = store or ModelStore()
    store.get(model_id)  # ModelNotFound with the list of what is installed
    return load_folder(store.path(model_id), model_id=model_id)
