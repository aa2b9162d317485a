"""Every mlx-lm internal Brisk relies on is listed in engine/runtime/mlx_hooks.py; each one is
checked against the installed version, and a moved one is named, not silently ignored."""

import importlib
import inspect
from pathlib import Path

import pytest

from brisk.engine.api.errors import BriskError
from brisk.engine.runtime.mlx_hooks import HOOKS, check_hook, check_hooks

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("hook", HOOKS, ids=[h.target for h in HOOKS])
def test_each_hook_holds_on_the_installed_mlx_lm_and_a_moved_one_is_named(hook, monkeypatch):
    check_hook(hook)
    module_name, attribute = hook.target.split(":")
    module = importlib.import_module(module_name)
    if hook.needs:  # the name is still there, but without what Brisk uses
        moved = type("Moved", (), {}) if inspect.isclass(getattr(module, attribute)) else (lambda: None)
        monkeypatch.setattr(module, attribute, moved)
        match = "no longer has"
    else:
        monkeypatch.delattr(module, attribute)
        match = "is gone"
    with pytest.raises(BriskError, match=match) as error:
        check_hook(hook)
    package = "mlx-lm" if module_name.startswith("mlx_lm") else "mlx"  # whose version to install
    assert hook.user in str(error.value) and str(error.value).startswith(f"{package} ")


def test_every_module_that_imports_mlx_lm_internals_is_listed():
    """A new private import of mlx-lm must come with its hook entry."""
    users = {h.user for h in HOOKS}
    private = []
    for path in [*ROOT.glob("engine/**/*.py"), *ROOT.glob("kernels/**/*.py")]:
        text = path.read_text()
        module = "brisk." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if ("import _" in text and "mlx_lm" in text) or "mlx_lm_base." in text or "mlx_lm_cache." in text:
            private.append(module)
    assert private and set(private) <= users, set(private) - users


def test_the_loader_checks_the_hooks(tiny_llama_dir, monkeypatch):
    import brisk.engine.runtime.mlx_hooks as hooks
    from brisk.engine.models.loader import load_folder

    check_hooks.cache_clear()
    monkeypatch.setattr(hooks, "HOOKS", (hooks.Hook("mlx_lm.utils:no_such_thing", "private call", "engine.x", "t"),))
    with pytest.raises(BriskError, match="no_such_thing is gone"):
        load_folder(tiny_llama_dir)
    check_hooks.cache_clear()


def test_a_hook_checked_where_it_runs_never_stops_a_model_loading(tiny_llama_dir, monkeypatch):
    """The ranks' launcher reaches into mlx's launcher, which a frozen bundle leaves out: the
    bundle's app failed to load any model while the loader checked that hook too."""
    import brisk.engine.runtime.mlx_hooks as hooks
    from brisk.engine.models.loader import load_folder

    gone = hooks.Hook("mlx._no_such_module:select", "rebound", "brisk.engine.x", "t", at_load=False)
    check_hooks.cache_clear()
    monkeypatch.setattr(hooks, "HOOKS", (gone,))
    try:
        assert load_folder(tiny_llama_dir).model is not None
        with pytest.raises(BriskError, match=r"^mlx \S+ moved a hook .*select is gone from mlx._no_such_module"):
            hooks.check_hooks_of("brisk.engine.x")
        hooks.check_hooks_of("brisk.engine.other")  # another module's hooks are its own
    finally:
        check_hooks.cache_clear()


def test_the_launcher_hooks_are_checked_where_the_launcher_runs():
    launcher = [h for h in HOOKS if h.user == "brisk.engine.distributed.quiet_launcher"]
    assert launcher and not any(h.at_load for h in launcher)
