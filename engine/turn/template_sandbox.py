"""A Jinja sandbox whose operations are bounded in the memory they can allocate.

Jinja's sandbox stops attribute escapes, not work: `{{ 'x' * 4000000000 }}` allocates
4 GB in one step, faster than any time budget can react. Here every operation a template
can use to build a value (the binary operators, `~`, slicing, filters, method and macro
calls, `str.format`, output, the buffers of `{% set %}` / `{% filter %}` / macros) is
charged to a budget of characters before it allocates, from an estimate of its result,
and with the size of what it built after. A render's budget is set per conversation
(engine/turn/chat_template.py), so peak memory is bounded by it whatever the template does and
however long it runs. Jinja's own hooks do most of this (`intercepted_binops`,
`call`, `finalize`, `concat`, `code_generator_class`); the environment is transformers'
(same globals, filters and extensions, copied from its own), so prompts are unchanged.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from contextlib import contextmanager
from contextvars import ContextVar
from string import Formatter
from typing import Any, Callable, Iterator

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import LoopContext, Macro, Undefined, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import Namespace, _PassArg, pass_context

# A list slot costs a pointer: about as much memory as this many characters.
ITEM_CHARS = 8
# What one more object costs beside its contents (a str's header is 49-80 bytes): charged for
# everything a template builds, so chains of small objects are bounded too.
OBJECT_CHARS = 64
# No chat template needs integers this long; squaring in a loop would otherwise grow them
# to gigabytes.
MAX_INT_BITS = 1 << 16
# Budget for work done with no render in progress (compile-time constant folding).
IDLE_BUDGET_CHARS = 1 << 20
# Worst growth of text by the string filters and methods that re-encode it: escaping
# (`"` -> `&#34;`), URL quoting (4 UTF-8 bytes -> 12 characters), JSON `\uXXXX`, case mapping.
REENCODE_GROWTH = {"escape": 6, "e": 6, "forceescape": 6, "urlencode": 12, "urlize": 6, "xmlattr": 6, "pprint": 10}
CASE_GROWTH = 3  # 'ß'.upper() == 'SS', 'ŉ'.upper() is 2 code points: 3 is the worst
# Filters and methods that turn their whole argument into text first.
STRINGIFYING_FILTERS = frozenset(
    {"capitalize", "lower", "upper", "title", "trim", "striptags", "string", "safe", "truncate", "wordcount"}
    | set(REENCODE_GROWTH)
)
PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


class TemplateLimitExceeded(SecurityError):
    """A template operation would build more than its render may; the message names it."""


class TemplateTimeout(TemplateLimitExceeded):
    pass


class TemplateCancelled(Exception):
    """The user's Stop, seen between two iterations or calls of the template."""


class RenderGuard:
    """One render's limits: the characters it may still build (a list slot counts
    ITEM_CHARS), the time it may run and the user's Stop. Time and Stop are checked at
    every loop iteration and call, the only ways a template can repeat work."""

    def __init__(self, chars: int, *, seconds: float = math.inf, cancelled: Callable[[], bool] = lambda: False):
        self.limit = self.left = chars
        self.seconds, self.cancelled = seconds, cancelled
        self.deadline = time.monotonic() + seconds

    def check(self, chars: int, what: str) -> None:
        if chars > self.left:
            raise TemplateLimitExceeded(f"{what} would build {chars:,} characters")

    def charge(self, chars: int, what: str) -> None:
        self.check(chars, what)
        self.left -= chars

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateTimeout(f"ran longer than {self.seconds:g} s")
        if self.cancelled():
            raise TemplateCancelled()


_GUARD: ContextVar[RenderGuard | None] = ContextVar("template_render_guard", default=None)


def _guard() -> RenderGuard:
    return _GUARD.get() or RenderGuard(IDLE_BUDGET_CHARS)


def shallow_size(value: Any) -> int:
    """What building `value` itself allocated: its characters, or its slots (not what they hold)."""
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return len(value) * ITEM_CHARS
    if isinstance(value, int):
        return value.bit_length() // 8
    return 0


def built_size(value: Any) -> int:
    return shallow_size(value) + OBJECT_CHARS


def text_size(value: Any, limit: int) -> int:
    """An upper estimate of the length of `str(value)` (or its JSON), shared references
    counted each time they appear; stops counting once past `limit`."""
    size, stack = 0, [value]
    while stack and size <= limit:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item) + 2  # quotes inside a container's repr
        elif isinstance(item, (bytes, bytearray)):
            size += 4 * len(item) + 3
        elif isinstance(item, bool) or item is None:
            size += 5
        elif isinstance(item, int):
            size += item.bit_length() // 3 + 2
        elif isinstance(item, float):
            size += 24
        elif isinstance(item, Undefined):
            size += 1
        elif isinstance(item, dict):
            size += 2 + 4 * len(item)
            if size <= limit:
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            size += 2 + 2 * len(item)
            if size <= limit:
                stack.extend(item)
        elif isinstance(item, Namespace):
            size += 16
            stack.append(item._Namespace__attrs)  # repr shows them
        elif isinstance(item, (type({}.keys()), type({}.values()), type({}.items()))):
            size += 16
            stack.append(list(item))
        else:
            size += 64  # macros, loops, generators, ranges: short reprs
    return size


def _int_result_bits(operator: str, left: int, right: int) -> int:
    if operator == "*":
        return left.bit_length() + right.bit_length()
    if operator == "**" and right > 0 and abs(left) > 1:
        return left.bit_length() * right
    return 0


def percent_format_size(fmt: str, args: Any, limit: int) -> int:
    """Upper estimate of `fmt % args`: the format, every argument's text and every width
    and precision (`*` ones read from the integer arguments)."""
    items = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    widths = 0
    for width, precision in PERCENT_SPEC.findall(fmt):
        widths += sum(int(n) for n in (width, precision) if n.isdigit())
        if "*" in (width, precision):
            widths += sum(abs(a) for a in items if isinstance(a, int))
    repr_growth = 10 if re.search(r"%[^a-zA-Z%]*[ra]", fmt) else 1  # repr escapes: '\x00' is 4, '\U000f0000' 10
    return len(fmt) + widths + repr_growth * text_size(items, limit)


def brace_format_size(fmt: str, args: tuple, kwargs: dict, limit: int) -> int:
    """Upper estimate of `fmt.format(*args, **kwargs)`: as percent_format_size, for `{}` fields."""
    widths = 0
    try:
        for _, _, spec, _ in Formatter().parse(fmt):
            widths += sum(int(n) for n in re.findall(r"\d+", spec or ""))
    except ValueError:
        return len(fmt)  # malformed: format() raises before it builds anything
    values = [*args, *kwargs.values()]
    if "{" in fmt:  # nested width fields take integers from the arguments
        widths += sum(abs(v) for v in values if isinstance(v, int))
    return len(fmt) + widths + 10 * text_size(values, limit)


def _replace_size(text: str, old: str, new: str, count: int | None) -> int:
    occurrences = len(text) + 1 if not old else text.count(old)
    if count is not None and count >= 0:
        occurrences = min(occurrences, count)
    return len(text) + occurrences * max(len(new) - len(old), 0)


def _as_int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) else default


def _text(value: Any, guard: RenderGuard, what: str) -> str:
    """`str(value)`, after checking the text it makes fits."""
    if isinstance(value, str):
        return value
    guard.check(text_size(value, guard.left), what)
    return str(value)


def _filter_estimate(name: str, guard: RenderGuard, value: Any, args: tuple, kwargs: dict) -> tuple[int, Any]:
    """(upper estimate of the filter's result, the value to call it with)."""
    what = f"the '{name}' filter"
    arg = lambda i, key, default=None: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
    if name == "center":
        text = _text(value, guard, what)
        return max(len(text), _as_int(arg(0, "width", 80))), value
    if name == "indent":
        text = _text(value, guard, what)
        width = arg(0, "width", 4)
        per_line = len(width) if isinstance(width, str) else _as_int(width)
        return len(text) + (text.count("\n") + 1) * per_line, value
    if name == "format":
        return percent_format_size(_text(value, guard, what), kwargs or args, guard.left), value
    if name == "replace":
        text = _text(value, guard, what)
        old, new = str(arg(0, "old", "")), str(arg(1, "new", ""))
        return _replace_size(text, old, new, arg(2, "count")), value
    if name == "wordwrap":
        text = _text(value, guard, what)
        return len(text) * (1 + len(str(arg(2, "wrapstring") or "\n"))), value
    if name == "join":
        items = value if isinstance(value, (list, tuple, str)) else list(value)  # a generator: count it first
        separator = str(arg(0, "d", ""))
        return text_size(items, guard.left) + len(items) * len(separator), items
    if name in ("batch", "slice"):
        count = _as_int(arg(0, "linecount" if name == "batch" else "slices"))
        return count * ITEM_CHARS, value
    if name == "sum" and isinstance(arg(1, "start"), (list, tuple)):
        items = list(value)
        return sum(shallow_size(i) for i in items) + shallow_size(arg(1, "start")), items
    if name in STRINGIFYING_FILTERS:
        growth = REENCODE_GROWTH.get(name, CASE_GROWTH)
        end = str(arg(2, "end", "")) if name == "truncate" else ""
        return growth * text_size(value, guard.left) + len(end), value
    return 0, value


def _call_estimate(owner: Any, name: str, args: tuple, kwargs: dict, limit: int) -> int:
    """Upper estimate of what a call builds, for the calls whose result can outgrow their
    arguments: some methods of str, and two globals. Others build at most a few times their
    input, charged afterwards."""
    arg = lambda i, key, default=None: args[i] if len(args) > i else kwargs.get(key, default)  # noqa: E731
    if name == "strftime_now":  # transformers': '%c' is 2 characters and makes 24
        return 16 * len(str(arg(0, "format", "")))
    if name == "generate_lorem_ipsum":  # Jinja's lipsum(n, html, min, max)
        return _as_int(arg(0, "n", 5)) * max(_as_int(arg(3, "max", 100)), 0) * 16
    if not isinstance(owner, str):
        return 0
    if name in ("ljust", "rjust", "center", "zfill"):
        return max(len(owner), _as_int(arg(0, "width")))
    if name == "expandtabs":
        return len(owner) + owner.count("\t") * max(_as_int(arg(0, "tabsize", 8)), 0)
    if name == "replace":
        count = arg(2, "count")
        return _replace_size(owner, str(arg(0, "old", "")), str(arg(1, "new", "")), count)
    if name == "join":
        items = arg(0, "iterable", ())
        return text_size(items, limit) + len(owner) * (len(items) if isinstance(items, (list, tuple, str)) else 0)
    if name == "translate":
        table = arg(0, "table")
        grow = max((len(v) for v in table.values() if isinstance(v, str)), default=1) if isinstance(table, dict) else 1
        return len(owner) * max(grow, 1)
    if name in ("encode", "upper", "lower", "title", "capitalize", "swapcase", "casefold"):
        return CASE_GROWTH * len(owner) + 4
    return 0


def _bounded_filter(name: str, func: Any) -> Any:
    """`func` charged to the render's budget. Taking the context also keeps Jinja from
    running the filter at compile time, outside any render."""
    pass_arg = _PassArg.from_obj(func)

    @pass_context
    def bounded(context, value, *args, **kwargs):
        guard = _guard()
        what = f"the '{name}' filter"
        estimate, value = _filter_estimate(name, guard, value, args, kwargs)
        guard.check(estimate, what)
        if pass_arg is _PassArg.context:
            result = func(context, value, *args, **kwargs)
        elif pass_arg is _PassArg.eval_context:
            result = func(context.eval_ctx, value, *args, **kwargs)
        elif pass_arg is _PassArg.environment:
            result = func(context.environment, value, *args, **kwargs)
        else:
            result = func(value, *args, **kwargs)
        guard.charge(built_size(result), what)
        return result

    bounded.__name__ = bounded.__qualname__ = getattr(func, "__name__", name)
    bounded.__doc__ = func.__doc__
    return bounded


def bounded_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' `tojson` (json.dumps with these options, HTML left alone), built piece
    by piece so a small structure of shared references cannot expand past the budget."""
    guard, pieces = _guard(), []
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    for piece in encoder.iterencode(x):
        guard.charge(len(piece), "the 'tojson' filter")
        pieces.append(piece)
    return "".join(pieces)


def _appends_per_iteration(loop: nodes.For) -> int:
    """Pieces of output one iteration of `loop` yields or appends to a buffer (inner loops
    and macros count their own)."""
    count, stack = 0, list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (nodes.For, nodes.Macro)):
            continue
        if isinstance(node, nodes.Output):
            count += len(node.nodes)
        stack.extend(node.iter_child_nodes())
    return count


class BoundedCodeGenerator(CodeGenerator):
    """Routes the two operations Jinja compiles to plain Python, `~` and slicing, through
    the environment, so they are charged like the rest."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            markup = "context.eval_ctx.autoescape"
        else:
            markup = "True" if frame.eval_ctx.autoescape else "False"
        self.write("environment.join_texts((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(f"), {markup})")

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        # `for x in environment.ticking(items, n)`: every iteration checks time and Stop, and
        # charges the n pieces of text its body may add to a block's buffer
        appends = nodes.Const(_appends_per_iteration(node))
        node.iter = nodes.Call(nodes.EnvironmentAttribute("ticking"), [node.iter, appends], [], None, None)
        super().visit_For(node, frame)

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self._charged(super().visit_List, node, frame)

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        self._charged(super().visit_Tuple, node, frame)

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self._charged(super().visit_Dict, node, frame)

    def _charged(self, visit: Callable, node: nodes.Expr, frame: Frame) -> None:
        """`environment.built([...])`: a literal in a loop builds a new object each time."""
        if getattr(node, "ctx", "load") != "load":  # `{% for a, b in ... %}` assigns to a tuple
            return visit(node, frame)
        self.write("environment.built(")
        visit(node, frame)
        self.write(")")

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, nodes.Slice):
            return super().visit_Getitem(node, frame)
        self.write("environment.slice_of(")
        self.visit(node.node, frame)
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            self.write(", ")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write(")")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable sandbox whose operations are charged to the render's budget (see the
    module docstring). Built from another environment (transformers' chat environment)
    so templates see the same options, globals, filters and tags."""

    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, like: ImmutableSandboxedEnvironment):
        super().__init__(
            trim_blocks=like.trim_blocks,
            lstrip_blocks=like.lstrip_blocks,
            keep_trailing_newline=like.keep_trailing_newline,
            extensions=[type(extension) for extension in like.extensions.values()],
            finalize=self.charge_output,
        )
        self.globals.update(like.globals)
        filters = {**like.filters, "tojson": bounded_tojson} if "tojson" in like.filters else dict(like.filters)
        self.filters = {name: _bounded_filter(name, func) for name, func in filters.items()}

    @staticmethod
    def charge_output(value: Any) -> Any:
        """Every `{{ ... }}` is turned into text: charge that text before it is made."""
        if _GUARD.get() is not None:  # at compile time, constants are as long as the source
            guard = _guard()
            guard.charge(text_size(value, guard.left) if not isinstance(value, str) else len(value), "output")
        return value

    def concat(self, pieces: Any) -> str:  # `"".join` in Environment
        """Joins the buffers of macros, `{% set %}` and `{% filter %}` blocks: literal text in
        a loop reaches them without any other operation."""
        guard = _guard()
        if not isinstance(pieces, list):
            pieces = list(pieces)
        guard.charge(sum(len(piece) for piece in pieces), "a block's text")
        return "".join(pieces)

    def join_texts(self, pieces: tuple, markup: bool) -> str:
        """The `~` operator."""
        guard = _guard()
        guard.charge(text_size(pieces, guard.left), "'~'")
        return markup_join(pieces) if markup else str_join(pieces)

    @staticmethod
    def ticking(items: Any, appends: int) -> Iterator[Any]:
        guard, cost = _guard(), appends * ITEM_CHARS
        for item in items:
            guard.tick()
            if cost:
                guard.charge(cost, "a loop's output")
            yield item

    @staticmethod
    def built(value: Any) -> Any:
        _guard().charge(built_size(value), "a literal")
        return value

    def slice_of(self, value: Any, start: Any, stop: Any, step: Any) -> Any:
        result = value[start:stop:step]
        _guard().charge(built_size(result), "a slice")
        return result

    def call_binop(self, context, operator, left, right):
        guard = _guard()
        what = f"'{operator}'"
        if isinstance(left, int) and isinstance(right, int):
            bits = _int_result_bits(operator, left, right)
            if bits > MAX_INT_BITS:
                raise TemplateLimitExceeded(f"{what} would make a {bits:,}-bit number")
        elif operator == "*":
            sequence, count = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(count, int) and isinstance(sequence, (str, list, tuple)):
                guard.check(shallow_size(sequence) * max(count, 0), what)
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            guard.check(shallow_size(left) + shallow_size(right), what)
        elif operator == "%" and isinstance(left, str):
            guard.check(percent_format_size(left, right, guard.left), what)
        result = super().call_binop(context, operator, left, right)
        guard.charge(built_size(result), what)
        return result

    def wrap_str_format(self, value: Any):
        format_method = super().wrap_str_format(value)
        if format_method is None:
            return None
        fmt = value.__self__

        @functools.wraps(format_method)
        def bounded(*args, **kwargs):
            guard = _guard()
            if value.__name__ == "format_map" and args and isinstance(args[0], dict):
                guard.check(brace_format_size(fmt, (), args[0], guard.left), "str.format_map")
            else:
                guard.check(brace_format_size(fmt, args, kwargs, guard.left), "str.format")
            result = format_method(*args, **kwargs)
            guard.charge(len(result), "str.format")
            return result

        return bounded

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805  (Jinja's own signature)
        guard = _guard()
        guard.tick()  # macros and recursive loops repeat work through calls
        name = getattr(__obj, "__name__", "")
        what = f"{name}()" if name else "a call"
        owner = getattr(__obj, "__self__", None)
        if name == "join" and isinstance(owner, str) and args and not isinstance(args[0], (list, tuple, str)):
            args = (list(args[0]), *args[1:])  # a generator: count its items before joining them
        guard.check(_call_estimate(owner, name, args, kwargs, guard.left), what)
        result = super().call(__context, __obj, *args, **kwargs)
        if not isinstance(__obj, (Macro, LoopContext)):  # their text was charged as it was built
            guard.charge(built_size(result), what)
        return result


@contextmanager
def guarded(guard: RenderGuard) -> Iterator[RenderGuard]:
    """Within this block, templates of a BoundedSandbox charge their work to `guard`."""
    token = _GUARD.set(guard)
    try:
        yield guard
    finally:
        _GUARD.reset(token)
