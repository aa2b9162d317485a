"""The prompt cache: layers plus what they stand for (tokens, KV mode, position map)."""

from brisk.engine.kv.prompt_cache import PromptCache

__all__ = ["PromptCache"]
