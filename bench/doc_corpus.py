"""The documents and questions of `brisk bench doc-qa`: real, varied text from this machine.

A document is excerpts of files found here (licences under /usr/share/common-licenses,
Python standard-library sources, man pages, the project's README), each used once, in an
order and at offsets drawn from the seed, cut to a token length. Facts are planted as
sentences of their own between paragraphs of prose excerpts (never inside code); the code
question asks about a real function of a stdlib excerpt. Everything follows from the seed,
so a seed names the same document on every machine with the same files.

Question kinds (`KINDS`): a single fact at several depths, two hops joining two places,
an aggregation (list every X), an exact quote, and which function calls Y.
"""

from __future__ import annotations

import ast
import builtins
import gzip
import random
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("fact", "two_hop", "aggregation", "quote", "code")
FACT_DEPTHS = (0.1, 0.5, 0.9)
PIECE_CHARS = (2500, 6000)  # an excerpt's length, drawn per piece

LEDGERS = ("Heron", "Juniper", "Osprey", "Marlin", "Saffron", "Tamarind", "Wren", "Bramble", "Quill", "Larkspur")
ROOMS = ("Quarry", "Lantern", "Cobalt", "Orchard", "Falcon", "Granite", "Meadow", "Harbour")
PEOPLE = (
    "Lindqvist",
    "Okonkwo",
    "Takahashi",
    "Villanueva",
    "Brennan",
    "Kowalczyk",
    "Abernathy",
    "Moreau",
    "Castellanos",
)
INSPECTORS = ("Adeyemi", "Fairbanks", "Halvorsen", "Ishikawa", "Montague", "Petrakis", "Rasmussen", "Szabo", "Whitlock")
CODE_WORDS = (
    ("amber", "cobalt", "crimson", "ivory", "jade", "scarlet", "silver", "violet"),
    ("falcon", "otter", "badger", "heron", "lynx", "marten", "walrus", "bison"),
)
MOTTO_WORDS = (
    ("salt", "rope", "lamps", "ink", "bread", "stone", "wax", "tide"),
    ("sugar", "oar", "dusk", "paper", "wine", "sand", "thread", "moss"),
)


@dataclass
class Question:
    kind: str
    text: str
    answer: list[str]  # every item must appear in the answer (exact strings)
    depth: float = -1.0  # where the fact sits (0-1), -1 when it has no single place
    exact: bool = False  # quote: the whole string, words in order
    max_tokens: int = 32  # room for a full sentence: a 12-token cap cut "...ledger is ivory-ot"


@dataclass
class Document:
    seed: int
    text: str
    sources: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def _strip_roff(text: str) -> str:
    """A man page's source as plain prose: macro lines out, font escapes off."""
    lines = []
    for line in text.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith("."):
            words = line.split(None, 1)
            if words[0] in (".SH", ".SS") and len(words) > 1:
                lines.append("\n" + words[1].strip('"'))
            elif words[0] in (".PP", ".LP", ".P", ".TP", ".IP", ".sp", ".br"):
                lines.append("")
            elif words[0] in (".B", ".I", ".BR", ".IR", ".BI", ".RB", ".RI") and len(words) > 1:
                lines.append(words[1].replace('"', ""))
            continue
        lines.append(line)
    text = "\n".join(lines)
    text = re.sub(r"\\f[0-9BIRP]|\\f\(..|\\&|\\\(..|\\[-e]", lambda m: "-" if m.group() == "\\-" else "", text)
    return re.sub(r"\n{3,}", "\n\n", text)


def _pool(readme: Path | None) -> dict[str, list[Path]]:
    """The files each kind of excerpt comes from, sorted (the seed picks among them)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    licences = sorted(p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file())
    # gcloud ships thousands of near-identical pages: left out, the suite wants varied text
    man = sorted(p for p in Path("/usr/share/man/man1").glob("*.1.gz") if not p.name.startswith("gcloud"))
    code = sorted(p for p in stdlib.glob("*.py") if 8_000 < p.stat().st_size < 200_000)
    return {"licence": licences, "man": man, "code": code, "readme": [readme] if readme and readme.is_file() else []}


def _read(kind: str, path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    return _strip_roff(text) if kind == "man" else text


def _code_excerpt(source: str, rng: random.Random, chars: int) -> str | None:
    """Whole top-level statements of a module, about `chars` long, from a drawn one."""
    try:
        nodes = ast.parse(source).body
    except SyntaxError:
        return None
    lines = source.splitlines()
    starts = [i for i, n in enumerate(nodes) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    if not starts:
        return None
    first = rng.choice(starts)
    picked, size = [], 0
    for node in nodes[first:]:
        first_line = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        seg = "\n".join(lines[first_line - 1 : node.end_lineno])
        picked.append(seg)
        size += len(seg)
        if size >= chars:
            break
    return "\n\n".join(picked)


def _prose_excerpt(text: str, rng: random.Random, chars: int) -> str:
    """`chars` of `text` from a drawn paragraph start."""
    if len(text) <= chars:
        return text.strip()
    starts = [m.end() for m in re.finditer(r"\n\s*\n", text[: len(text) - chars // 2])] or [0]
    at = rng.choice(starts)
    piece = text[at : at + chars]
    cut = piece.rfind("\n\n")
    return (piece[:cut] if cut > chars // 2 else piece).strip()


def callers_of(source: str) -> list[tuple[str, str]]:
    """(function, called name) pairs where the name is called by exactly one function of
    `source` and is not a builtin: the code question's candidates, in source order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    calls: dict[str, set[str]] = {}
    defined: dict[str, int] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        defined[fn.name] = defined.get(fn.name, 0) + 1
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name and name != fn.name:
                    calls.setdefault(name, set()).add(fn.name)
    pairs = []
    for name, fns in calls.items():
        (caller,) = fns if len(fns) == 1 else (None,)
        if caller and defined.get(caller) == 1 and len(name) >= 6 and not hasattr(builtins, name):
            if len(re.findall(rf"\b{re.escape(name)}\s*\(", source)) == 1:  # one call site in the text
                pairs.append((caller, name))
    return pairs


def _plant_points(doc: str, prose_spans: list[tuple[int, int]]) -> list[int]:
    """Paragraph boundaries inside prose excerpts: where a planted sentence reads naturally."""
    points = []
    for s, e in prose_spans:
        points += [s + m.start() for m in re.finditer(r"\n\n", doc[s:e])] + [e]
    return sorted(set(points)) or [0]


def build_document(seed: int, tokenizer, n_tokens: int, readme: Path | None = None) -> Document:
    """The seed's document of about `n_tokens` tokens (planted sentences add a few dozen)
    with its questions."""
    rng = random.Random(seed)
    pool = _pool(readme)
    kinds = [k for k in ("code", "licence", "man", "code", "man", "licence", "readme") if pool[k]]
    first = kinds[:3]  # every document starts from code, a licence and a man page; then the seed draws
    used: set[Path] = set()
    pieces: list[tuple[str, str, str]] = []  # kind, source, text
    tokens, k, code_pair = 0, 0, None
    while tokens < n_tokens and k < 400:
        kind = first[k] if k < len(first) else rng.choice(kinds)
        k += 1
        choices = [p for p in pool[kind] if p not in used]
        if not choices:
            continue
        path = rng.choice(choices)
        used.add(path)
        chars = rng.randint(*PIECE_CHARS)
        if kind == "code":
            text = _code_excerpt(_read(kind, path), rng, chars)
            if not text:
                continue
            if code_pair is None:
                pairs = callers_of(text)
                if not pairs:
                    continue
                code_pair = rng.choice(pairs)
        else:
            text = _prose_excerpt(_read(kind, path), rng, chars)
        if len(text) < 400:
            continue
        pieces.append((kind, path.name, text))
        tokens += len(tokenizer.encode(text))
    rng.shuffle(pieces)
    doc, spans = "", []
    for kind, name, text in pieces:
        header = f"=== {name} ===\n"
        if kind != "code":
            spans.append((len(doc) + len(header), len(doc) + len(header) + len(text)))
        doc += header + text + "\n\n"
    ids = tokenizer.encode(doc)
    if len(ids) > n_tokens:  # cut at the last line break before the token budget
        cut = tokenizer.decode(ids[:n_tokens])
        doc = cut[: max(cut.rfind("\n"), len(cut) // 2)]
    points = [p for p in _plant_points(doc, spans) if p < len(doc)]
    points = points or [m.start() for m in re.finditer(r"\n\n", doc)] or [len(doc)]
    document = Document(seed, doc, [name for _, name, _ in pieces])
    planted: list[tuple[float, str]] = []
    names = rng.sample(LEDGERS, len(FACT_DEPTHS) + 1)
    for depth, name in zip(FACT_DEPTHS, names):
        # a word pair, not digits: SmolLM2 reads digits one token each and garbles them
        code = f"{rng.choice(CODE_WORDS[0])}-{rng.choice(CODE_WORDS[1])}"
        planted.append((depth, f"Archive note: the storage code of the {name} ledger is {code}."))
        document.questions.append(
            Question(
                "fact",
                f"What is the storage code of the {name} ledger? Answer with the code only.",
                [code],
                depth,
                max_tokens=32,
            )
        )
    room, person = rng.choice(ROOMS), rng.choice(PEOPLE)
    planted.append((0.3, f"Archive note: the {names[-1]} ledger is kept in the {room} room."))
    planted.append((0.7, f"Archive note: the key to the {room} room is held by Clerk {person}."))
    document.questions.append(
        Question(
            "two_hop",
            f"Who holds the key to the room where the {names[-1]} ledger is kept? Answer with the name only.",
            [person],
            max_tokens=32,
        )
    )
    inspectors = rng.sample(INSPECTORS, 4)
    for depth, who in zip((0.15, 0.4, 0.65, 0.85), inspectors):
        planted.append((depth, f"Inspection note: Inspector {who} signed off on this section."))
    document.questions.append(
        Question(
            "aggregation",
            "Which inspectors signed off on sections of this document? List every inspector's name.",
            inspectors,
            max_tokens=48,
        )
    )
    (a, c), (b, d) = rng.sample(MOTTO_WORDS[0], 2), rng.sample(MOTTO_WORDS[1], 2)
    motto = f"{a} before {b}, {c} before {d}"
    planted.append((0.55, f'Archive note: the keepers\' motto is "{motto}".'))
    document.questions.append(
        Question("quote", "Quote the keepers' motto exactly, word for word.", [motto], 0.55, exact=True, max_tokens=40)
    )
    for depth, sentence in sorted(planted, reverse=True):  # from the end, so offsets hold
        at = min(points, key=lambda p: abs(p - depth * len(doc)))
        doc = doc[:at] + "\n\n" + sentence + doc[at:]
    document.text = doc
    if code_pair and re.search(rf"\b{re.escape(code_pair[1])}\s*\(", doc) and f"def {code_pair[0]}(" in doc:
        caller, callee = code_pair
        document.questions.append(
            Question(
                "code",
                f"In the Python source above, which function calls `{callee}`? Answer with the function's name only.",
                [caller],
                doc.find(f"{callee}(") / len(doc),
                max_tokens=32,
            )
        )
    return document


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def score(question: Question, answer: str) -> dict:
    """right: every fact present (exact quote: the whole quote, words in order, case and
    punctuation aside); share: the share of the facts present (aggregation's recall)."""
    if question.exact:
        hits = [_normal(question.answer[0]) in _normal(answer)]
    else:
        hits = [bool(re.search(rf"(?<!\w){re.escape(item)}(?!\w)", answer, re.I)) for item in question.answer]
    return {"right": all(hits), "share": sum(hits) / len(hits)}
