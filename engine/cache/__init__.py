"""The prompt cache: layers plus what they stand for (tokens, KV mode, position map)."""

from engine.cache.prompt_cache import PromptCache

__all__ = ["PromptCache"]
