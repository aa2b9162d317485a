"""The prompt cache: layers plus what they stand for (tokens, KV mode, position map)."""

from engine.cache.prompt_cache import PromptCache, kv_digest, tokens_digest

__all__ = ["PromptCache", "kv_digest", "tokens_digest"]
