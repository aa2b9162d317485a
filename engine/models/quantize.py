"""`brisk models quantize`: an installed float model as a new, quantized installed model.

mlx-lm's own quantization (affine, bits 4 or 8, groups of 32 or 64) does the work; scales
and biases are stored in float16 as mlx-community models store them, which halves their
share of memory. The source model is left as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from brisk.engine.api.errors import BriskError
from brisk.engine.models.folder import read_config
from brisk.engine.models.store import CATALOG_FILE, CatalogEntry, ModelStore, validate_model_id

BITS = (4, 8)
GROUP_SIZES = (32, 64)
# Weights and their index are rewritten; everything else (tokenizer, template) is copied.
REWRITTEN = {"config.json", "model.safetensors.index.json", CATALOG_FILE}


def quantize_installed(
    model_id: str, *, bits: int, group_size: int, new_id: str | None = None, store: ModelStore | None = None
) -> CatalogEntry:
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    store = store or ModelStore()
    if bits not in BITS or group_size not in GROUP_SIZES:
        raise BriskError(f"Brisk quantizes to bits {BITS} in groups of {GROUP_SIZES}, not {bits} bits / {group_size}")
    store.get(model_id)  # ModelNotFound names what is installed
    source = store.path(model_id)
    config = read_config(source)
    if config.get("quantization"):
        raise BriskError(
            f"{model_id} is already quantized ({config['quantization'].get('bits')} bits); "
            "quantize its float original instead"
        )
    new_id = validate_model_id(new_id or f"{model_id}-q{bits}")
    if store.has(new_id):
        raise BriskError(f"A model '{new_id}' is already installed; choose another --id")
    model, loaded_config = load_model(source, lazy=True)
    model, quantized_config = quantize_model(model, loaded_config, group_size, bits)

    def half_scales(path: str, value):
        return value.astype(mx.float16) if path.endswith((".scales", ".biases")) else value

    model.update(tree_map_with_path(half_scales, model.parameters()))
    with store.staging(new_id) as stage:
        save_model(stage, model, donate_model=True)
        save_config(quantized_config, config_path=stage / "config.json")
        _copy_the_rest(source, stage)
        return store.register(stage, model_id=new_id, source=f"quantized:{model_id}:{bits}bit-g{group_size}")


def _copy_the_rest(source: Path, dest: Path) -> None:
    for item in source.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name not in REWRITTEN:
            shutil.copy2(item, dest / item.name)
