"""Errors the engine reports to users. Each message names the problem and the fix."""


class BriskError(Exception):
    """Base class: an expected failure with a message meant for the user."""

    kind = "error"


class ModelNotFound(BriskError):
    kind = "model_not_found"


class BrokenModelFolder(BriskError):
    kind = "broken_model"


class UnsupportedModel(BriskError):
    kind = "unsupported_model"


class GGUFImportError(BriskError):
    kind = "gguf_import"


class DownloadError(BriskError):
    kind = "download"


class ContextOverflow(BriskError):
    kind = "context_overflow"

    def __init__(self, prompt_tokens: int, context_length: int, model_id: str):
        self.prompt_tokens: int | None = prompt_tokens  # None: counted in characters, never tokenized
        self.context_length = context_length
        super().__init__(
            f"The conversation is {prompt_tokens} tokens but {model_id} holds at most "
            f"{context_length} (prompt plus at least one answer token). Shorten it, start "
            "a new chat, or set the overflow policy to truncate the oldest turns."
        )


class ConversationTooLong(ContextOverflow):
    """Found by counting characters, before the tokenizer spends memory on the text."""

    def __init__(self, chars: int, context_length: int, model_id: str, max_chars: int):
        self.prompt_tokens = None
        self.context_length = context_length
        BriskError.__init__(
            self,
            f"The conversation is {chars:,} characters; {model_id} holds {context_length:,} tokens, which is at "
            f"most about {max_chars:,} characters. Shorten it, attach less, or start a new chat.",
        )


class PrefillMemoryError(BriskError):
    kind = "out_of_memory"


class InvalidSettings(BriskError):
    kind = "invalid_settings"


class UnsafeLocation(BriskError):
    """A data folder or file another user owns or could change (engine/runtime/private_files.py)."""

    kind = "unsafe_location"


class TurnCancelled(Exception):
    """Raised inside generation when the user cancels; caught by the session."""
