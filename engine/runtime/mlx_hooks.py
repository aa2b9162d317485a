"""Every place Brisk reaches into mlx-lm's (and MLX's) internals, listed once and checked.

mlx-lm is pinned, but an upgrade can move a private name or change a signature, and each
of these would then break in its own file, often silently (a patch that no longer takes
effect). `check_hooks()` verifies each against the installed version and names the hook
that moved; the loader runs it once per process before the first model loads.

Public, documented mlx-lm API (load, generate_step, make/trim/save/load_prompt_cache,
make_sampler) is used normally and not listed here.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version

from brisk.engine.api.errors import BriskError


@dataclass(frozen=True)
class Hook:
    target: str  # "module:attribute" inside mlx-lm or MLX
    kind: str  # rebound | subclassed | injected | wrapped | private call | private field
    user: str  # the Brisk module that relies on it
    why: str
    needs: tuple[str, ...] = ()  # parameters (for functions) or attributes (for classes) relied on
    # Checked before the first model loads; False: only by its user, where it runs (the ranks'
    # launcher: a frozen bundle leaves mlx's launcher out, and must still load models)
    at_load: bool = True


HOOKS = (
    Hook(
        "mlx_lm.models.base:quantized_scaled_dot_product_attention",
        "rebound",
        "brisk.engine.kv.packed_cache",
        "packed KV attention goes to Brisk's kernels (kernels/kv_attention.py), which read PackedKVCache's layouts",
        ("queries", "q_keys", "q_values", "scale", "mask", "group_size", "bits"),
    ),
    Hook(
        "mlx_lm.models.base:scaled_dot_product_attention",
        "rebound",
        "brisk.engine.accel.attention_capture",
        "SpecPrefill's lookahead and UniPrefill's drop layers capture queries and keys, rebound in each model "
        "module for one call",
        ("queries", "keys", "values", "cache", "scale", "mask"),
    ),
    Hook(
        "mlx_lm.models.base:scaled_dot_product_attention",
        "rebound",
        "brisk.kernels.fused_attention",
        "float attention on the CPU goes to the fused kernel, rebound in each loaded model's modules",
        ("queries", "keys", "values", "cache", "scale", "mask", "sinks"),
    ),
    Hook(
        "mlx_lm.models.activations:swiglu",
        "rebound",
        "brisk.kernels.activation",
        "SwiGLU's silu(gate) * x on the CPU goes to the native kernel, rebound in each loaded model's modules",
        ("gate", "x"),
    ),
    Hook(
        "mlx_lm.models.cache:QuantizedKVCache",
        "subclassed",
        "brisk.engine.kv.packed_cache",
        "PackedKVCache: keys per channel, values per token, each at its own bits; float16 scales",
        ("update_and_fetch", "state", "trim", "is_trimmable", "group_size", "bits", "step", "offset"),
    ),
    Hook(
        "mlx_lm.models.cache:load_prompt_cache",
        "injected",
        "brisk.engine.kv.packed_cache",
        "PackedKVCache is set on mlx_lm.models.cache, where load_prompt_cache looks classes up by name",
    ),
    Hook(
        "mlx_lm.models.cache:KVCache",
        "subclassed",
        "brisk.engine.kv.half",
        "HalfKVCache stores float32 keys and values as float16 before KVCache's own update_and_fetch",
        ("update_and_fetch", "keys", "values", "offset", "state"),
    ),
    Hook(
        "mlx_lm.models.cache:RotatingKVCache",
        "subclassed",
        "brisk.engine.kv.half",
        "HalfRotatingKVCache: the sliding-window cache storing float16; built with the window's max_size and keep",
        ("update_and_fetch", "max_size", "keep", "offset"),
    ),
    Hook(
        "mlx_lm.models.cache:load_prompt_cache",
        "injected",
        "brisk.engine.kv.half",
        "HalfKVCache and HalfRotatingKVCache are set on mlx_lm.models.cache, where load_prompt_cache looks classes "
        "up by name",
    ),
    Hook(
        "mlx_lm.models.rope_utils:initialize_rope",
        "wrapped",
        "brisk.engine.accel.positions",
        "sparse prefill shifts RoPE positions by wrapping the model's RoPE modules (rope_utils classes)",
    ),
    Hook(
        "mlx_lm.models.cache:RotatingKVCache",
        "private field",
        "brisk.engine.accel.speculative.rewind",
        "rewinding a sliding-window cache saves and restores its _idx",
        ("_idx", "keys", "values", "offset"),
    ),
    Hook(
        "mlx_lm.models.cache:RotatingKVCache",
        "private call",
        "brisk.engine.accel.uniprefill.prefill",
        "sliding-window layers after a drop rebuild each chunk's mask from their own cache, sized to the window",
        ("make_mask", "max_size"),
    ),
    Hook(
        "mlx_lm.models.cache:ArraysCache",
        "private field",
        "brisk.engine.accel.speculative.rewind",
        "rewinding recurrent layers saves and restores their state",
        ("state",),
    ),
    Hook(
        "mlx_lm.utils:_get_classes",
        "private call",
        "brisk.engine.models.folder",
        "mlx-lm's own model_type -> class lookup, remappings included",
        ("config",),
    ),
    Hook(
        "mlx.nn:Embedding",
        "subclassed",
        "brisk.kernels.skinny_matmul",
        "a tied output head's as_linear takes few-row products to the native kernel",
        ("as_linear",),
    ),
    Hook(
        "mlx.nn:Linear",
        "subclassed",
        "brisk.kernels.skinny_matmul",
        "float Linear layers send 2-16 row products to the native kernel",
        ("weight", "bias"),
    ),
    Hook(
        "mlx.nn:QuantizedLinear",
        "subclassed",
        "brisk.kernels.quantized_matmul",
        "quantized Linear layers send their products to the native kernel",
        ("weight", "scales", "biases", "bits", "group_size", "mode"),
    ),
    Hook(
        "mlx.nn:RMSNorm",
        "subclassed",
        "brisk.kernels.norm_rope",
        "RMSNorm runs as one native node on the CPU (MLX's CPU has no kernel for mx.fast.rms_norm)",
        ("weight", "eps"),
    ),
    Hook(
        "mlx.nn:RoPE",
        "subclassed",
        "brisk.kernels.norm_rope",
        "RoPE runs as one native node on the CPU, from the module's own settings",
        ("dims", "traditional", "base", "scale"),
    ),
    Hook(
        "mlx_lm.models.rope_utils:Llama3RoPE",
        "private field",
        "brisk.kernels.norm_rope",
        "Llama 3's RoPE runs on Brisk's kernel from the module's own frequency table",
        ("_freqs", "dims", "traditional"),
    ),
    Hook(
        "mlx_lm.models.cache:KVCache",
        "private field",
        "brisk.engine.decode.compiled",
        "the compiled decode step takes each layer's key/value buffers and offset for a run and puts them back",
        ("keys", "values", "offset", "step"),
    ),
    Hook(
        "mlx.nn:QuantizedEmbedding",
        "subclassed",
        "brisk.kernels.quantized_matmul",
        "a quantized embedding's lookup and as_linear (a tied head) run on Brisk's kernels",
        ("as_linear", "weight", "scales", "biases", "bits", "group_size", "mode"),
    ),
    Hook(
        "mlx._distributed_utils.launch:select",
        "rebound",
        "brisk.engine.distributed.quiet_launcher",
        "mlx.launch's relay threads wait on their ranks' output only (Brisk never writes to a rank's stdin, "
        "and waiting on an always-writable pipe kept each thread spinning)",
        at_load=False,
    ),
    Hook(
        "mlx._distributed_utils.launch:main",
        "private call",
        "brisk.engine.distributed.quiet_launcher",
        "mlx.launch's entry point, run in the process whose select was rebound",
        at_load=False,
    ),
)


def check_hook(hook: Hook) -> None:
    """BriskError naming the hook when the installed package no longer has what it needs."""
    module_name, attribute = hook.target.split(":")
    try:
        obj = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise _moved(hook, f"{attribute} is gone from {module_name}") from exc
    if not hook.needs:
        return
    if inspect.isclass(obj):
        missing = [n for n in hook.needs if not _class_has(obj, n)]
    else:
        params = inspect.signature(obj).parameters
        missing = [n for n in hook.needs if n not in params]
    if missing:
        raise _moved(hook, f"{hook.target} no longer has {', '.join(missing)}")


def _class_has(cls, name: str) -> bool:
    if hasattr(cls, name):
        return True
    try:  # instance attributes set in __init__ (e.g. RotatingKVCache._idx)
        return f"self.{name}" in inspect.getsource(cls)
    except (OSError, TypeError):
        return False


def _moved(hook: Hook, what: str) -> BriskError:
    package = "mlx-lm" if hook.target.startswith("mlx_lm") else "mlx"
    return BriskError(
        f"{package} {version(package)} moved a hook Brisk relies on ({hook.kind}, used by "
        f"{hook.user}: {hook.why}): {what}. Install the {package} version pyproject.toml pins."
    )


@lru_cache(maxsize=1)
def check_hooks() -> int:
    """Check, once per process, every hook checked before a model loads; returns how many."""
    at_load = [hook for hook in HOOKS if hook.at_load]
    for hook in at_load:
        check_hook(hook)
    return len(at_load)


def check_hooks_of(user: str) -> None:
    """Check the hooks `user` (a module name) relies on, where it runs."""
    for hook in HOOKS:
        if hook.user == user:
            check_hook(hook)
