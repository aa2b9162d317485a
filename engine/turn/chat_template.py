"""Render a model's chat template as the untrusted program it is: in a sandbox whose every
operation is bounded in memory, with a time budget, an output cap and the user's Stop, and
tokenize it so text inside messages can never become the template's control tokens.

A template is Jinja code shipped with the model. Jinja's sandbox stops attribute escapes
but not work: nested `range(99999)` loops ran 47 s and `{{ 'x' * 4000000000 }}` grew to
21 GB. engine/turn/template_sandbox.py charges each operation to a budget and checks time and
Stop at every loop iteration and call; the limits here are sized from the conversation,
so a long chat renders and only a template that blows its input up is refused.

The environment is transformers' own (its options, globals, filters and tags), so prompts
are byte-identical to `apply_chat_template(tokenize=False)`. Tokenizing is transformers'
`sanitize_control_tokens` scheme: control tokens inside messages are marked before
rendering and encoded as plain text, the template's own stay special, and a chat with
none is encoded exactly as `encode(text, add_special_tokens=False)` would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from brisk.engine.api.errors import BriskError, TurnCancelled
from brisk.engine.turn.template_sandbox import (
    BoundedSandbox,
    RenderGuard,
    TemplateCancelled,
    TemplateLimitExceeded,
    TemplateTimeout,
    guarded,
)

# Real templates render a short chat in milliseconds; two seconds is far beyond any of them.
DEFAULT_TEMPLATE_SECONDS = 2.0
# ... and a long one in well under a millisecond per message.
TEMPLATE_SECONDS_PER_MESSAGE = 0.002
# A template adds role markers and separators to the messages, not text of its own making:
# beyond twice the messages, this much per message and this much in all it is generating.
TEMPLATE_OVERHEAD_CHARS = 256 * 1024
TEMPLATE_MARKUP_CHARS_PER_MESSAGE = 1024
# Work (characters built, temporaries included) a render may do. ChatML-style templates
# build about 5 times their messages ('<|im_start|>' + role + '\n' + content + ...);
# this leaves room for templates that copy content a few more times (trim, split, tojson).
WORK_CHARS_PER_MESSAGE_CHAR = 32
WORK_CHARS_PER_MESSAGE = 8 * 1024
WORK_CHARS_FLOOR = 16 * 2**20


class TemplateError(BriskError):
    kind = "chat_template"


@dataclass(frozen=True)
class TemplateLimits:
    """What rendering one conversation may take, in proportion to the conversation."""

    output_chars: int
    work_chars: int
    seconds: float

    @classmethod
    def for_messages(cls, messages: list[dict]) -> TemplateLimits:
        chars = sum(len(str(m.get("content", ""))) + len(str(m.get("role", ""))) for m in messages)
        count = len(messages)
        return cls(
            output_chars=2 * chars + TEMPLATE_MARKUP_CHARS_PER_MESSAGE * count + TEMPLATE_OVERHEAD_CHARS,
            work_chars=WORK_CHARS_PER_MESSAGE_CHAR * chars + WORK_CHARS_PER_MESSAGE * count + WORK_CHARS_FLOOR,
            seconds=DEFAULT_TEMPLATE_SECONDS + TEMPLATE_SECONDS_PER_MESSAGE * count,
        )


def hf_tokenizer(tokenizer):
    return getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper -> the HF tokenizer


def render_chat(
    tokenizer, messages: list[dict], *, model_id: str, cancelled: Callable[[], bool] = lambda: False
) -> str:
    """The chat template rendered for `messages`, ready for the assistant's answer, as
    transformers' `apply_chat_template(add_generation_prompt=True, tokenize=False)`."""
    hf = hf_tokenizer(tokenizer)
    source = _template_source(hf, model_id)
    return _render(source, messages, hf.special_tokens_map, model_id=model_id, cancelled=cancelled)


def render_template(
    source: str,
    messages: list[dict],
    *,
    model_id: str,
    special_tokens: dict | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> str:
    """A template's source rendered for `messages` under the same limits (for templates
    not yet attached to a tokenizer, such as a GGUF's before import)."""
    return _render(source, messages, special_tokens or {}, model_id=model_id, cancelled=cancelled)


def encode_chat(
    tokenizer, messages: list[dict], *, model_id: str, cancelled: Callable[[], bool] = lambda: False
) -> list[int]:
    """Prompt tokens for `messages`: the template's control tokens are special tokens, the
    same strings inside a message are plain text (a message cannot forge a turn)."""
    from transformers.utils.chat_template_utils import (
        _get_control_token_patterns,
        encode_marked_chat,
        mark_control_tokens,
    )

    hf = hf_tokenizer(tokenizer)
    source = _template_source(hf, model_id)
    control_tokens, _ = _get_control_token_patterns(_control_tokens(hf, source, model_id))
    marked = mark_control_tokens(messages, control_tokens)
    text = _render(source, marked, hf.special_tokens_map, model_id=model_id, cancelled=cancelled)
    try:
        tokens = list(encode_marked_chat(hf, text))
    except ValueError as exc:  # the tokenizer makes a control token out of plain text
        raise TemplateError(f"A message cannot be encoded for {model_id}: {exc}") from exc
    if not tokens:  # MLX cannot take an empty prompt (it failed deep in a gather or reshape)
        raise TemplateError(f"The chat template of {model_id} renders these messages as nothing")
    return tokens


def _control_tokens(hf, source: str, model_id: str) -> tuple[str, ...]:
    """transformers' `_get_control_tokens`: the special tokens, and the added tokens the
    template writes (or those the tokenizer lists as its chat's control tokens)."""
    listed = getattr(hf, "chat_control_tokens", None)
    literals = _template_literals(source, model_id)

    def written(token: str) -> bool:  # whitespace tokens (Gemma's "\n") are ordinary text there
        return token in listed if listed is not None else token in literals and not token.isspace()

    return tuple(token.content for token in hf.added_tokens_decoder.values() if token.special or written(token.content))


@functools.lru_cache(maxsize=16)
def _template_literals(source: str, model_id: str) -> str:
    """The template's literal text and string constants, from its syntax tree. Not via
    transformers' helper: it compiles the template, and compiling folds constants, so
    `{{ 'x' * 4000000000 }}` would be built right there."""
    from jinja2 import TemplateSyntaxError, nodes

    try:
        tree = _sandbox().parse(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"The chat template of {model_id} failed: {exc}") from exc
    except RecursionError:  # thousands of nested brackets or blocks: no real template nests so
        raise TemplateError(f"The chat template of {model_id} nests too deeply to be read") from None
    literals = {node.data for node in tree.find_all(nodes.TemplateData)}
    literals |= {node.value for node in tree.find_all(nodes.Const) if isinstance(node.value, str)}
    return "\0".join(literals)


def _template_source(hf, model_id: str) -> str:
    try:
        return hf.get_chat_template()
    except ValueError as exc:  # several named templates and no default
        raise TemplateError(f"The chat template of {model_id} cannot be chosen: {exc}") from exc


@functools.lru_cache(maxsize=1)
def _sandbox() -> BoundedSandbox:
    # transformers' chat environment, for its options, globals (raise_exception,
    # strftime_now, dict, namespace), filters (tojson) and tags ({% generation %}).
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return BoundedSandbox(_compile_jinja_template("").environment)


@functools.lru_cache(maxsize=16)
def _compile(source: str):
    return _sandbox().from_string(source)


def _render(
    source: str, messages: list[dict], special_tokens: dict, *, model_id: str, cancelled: Callable[[], bool]
) -> str:
    from jinja2 import TemplateError as JinjaError

    limits = TemplateLimits.for_messages(messages)
    variables: dict[str, Any] = {
        **special_tokens,  # as transformers passes them: bos_token, eos_token...
        "messages": messages,
        "tools": None,
        "documents": None,
        "add_generation_prompt": True,
    }

    stopped = f"The chat template of {model_id} {{}} and was stopped. The template is broken or hostile: " + (
        "reinstall the model, or use one whose template renders normally."
    )
    pieces, chars = [], 0
    try:
        template = _compile(source)
        with guarded(RenderGuard(limits.work_chars, seconds=limits.seconds, cancelled=cancelled)):
            for piece in template.generate(**variables):
                chars += len(piece)
                if chars > limits.output_chars:
                    raise TemplateError(
                        stopped.format(
                            f"produced more than {limits.output_chars:,} characters for {len(messages):,} messages"
                        )
                    )
                if piece:  # `{{ '' }}` in a loop would grow the list alone
                    pieces.append(piece)
    except TemplateCancelled:
        raise TurnCancelled() from None
    except TemplateTimeout as exc:
        raise TemplateError(stopped.format(exc)) from None
    except TemplateLimitExceeded as exc:
        raise TemplateError(stopped.format(f"built too much ({exc}; this chat allows {limits.work_chars:,})")) from None
    except (JinjaError, ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as exc:
        # the template's own raise_exception(), a syntax error, or code that fails
        raise TemplateError(f"The chat template of {model_id} failed: {exc}") from exc
    return "".join(pieces)
