"""The code blocks of README.md and the documentation pages, and what the docs tests do with each.

The convention (docs/development/tests.md, "Snippets in the docs"):

* a block's language says what it is: ``bash`` (commands), ``python``, ``console`` (``$ command``
  lines, each followed by the output it prints), ``yaml`` (an hvdtrain config file); ``text`` or no
  language is a listing (an output, a synopsis, a diagram): nothing to run;
* a ``bash``, ``python``, ``yaml`` or ``ini`` block whose first line is a comment saying
  ``not run in CI: REASON`` (at its start or within it) is not executed: it needs a GPU, a
  cluster, your data, or trains for minutes; ``# run in CI by tests/PATH.py[::test_name]`` names
  the test that runs it;
* every other block is executed by tests/integration/test_doc_snippets.py (``bash`` and ``python``
  in a fresh temporary folder) or checked by tests/unit/test_doc_snippets.py (``console``,
  ``yaml``), and every ``hvdtrain`` command in any ``bash`` block, marked or not, is parsed by the
  CLI (``hvdtrain recipe`` commands resolve their config with ``--keys``: flags, keys, values and
  the rulebook) without training.

BENCHMARKS.md and RELIABILITY.md (included as pages) are records of measurements: their commands
reproduce them (minutes to hours) and are not in scope.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RUNNABLE = ("bash", "python")  # executed in a subprocess
CHECKED = ("console", "yaml")  # checked in-process
LISTING = ("", "text")
MARKABLE = ("bash", "python", "yaml", "ini")
INDENTED = "(indented)"  # an indented code block: refused, a fenced block says what it is
MARKER = re.compile(r"^#.*?\b(not run in CI|run in CI by)\b\s*:?\s*(.*)$")  # in the first line's comment


@dataclass(frozen=True)
class Snippet:
    """One fenced code block: where it is, its language, its text and its marker, if any."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: str | None = None  # "not run in CI" or "run in CI by"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        """Executed by the docs tests (not a listing, not marked)."""
        return self.lang in RUNNABLE and self.marker is None


def pages() -> list[Path]:
    """README.md and every Markdown page of the site (the generated ones hold no code)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def snippets(path: Path) -> list[Snippet]:
    """The fenced code blocks of ``path`` (MyST directives such as toctree and include left out)."""
    from markdown_it import MarkdownIt

    found = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        if token.type == "code_block":  # indented: no language to say what it is
            found.append(Snippet(path, token.map[0] + 1, INDENTED, token.content))
            continue
        if token.type != "fence" or token.info.strip().startswith("{"):
            continue
        lang = token.info.strip().split(" ")[0] if token.info.strip() else ""
        first = token.content.split("\n", 1)[0].strip()
        match = MARKER.match(first) if lang in MARKABLE else None
        found.append(Snippet(path, token.map[0] + 1, lang, token.content,
                             match.group(1) if match else None, match.group(2).strip() if match else ""))
    return found


def every_snippet() -> list[Snippet]:
    return [s for page in pages() for s in snippets(page)]


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: continuations joined, comments dropped,
    ``&&``/``;``/``|`` split."""
    commands, lines, pending = [], [], ""
    for line in text.replace("\\\n", " ").splitlines():  # a quoted string may span lines
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:
            continue
        lines.append(pending)
        pending = ""
    for line in lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in lexer:
            if word in (";", "&&", "||", "|", "&"):
                commands.append(words)
                words = []
            else:
                words.append(word)
        commands.append(words)
    return [c for c in commands if c]


def hvdtrain_args(command: list[str]) -> list[str] | None:
    """The arguments after ``hvdtrain`` in a command (behind horovodrun, mpirun, srun, docker exec),
    or None when the command does not run hvdtrain's CLI."""
    for i, word in enumerate(command):
        if Path(word).name == "hvdtrain" and i + 1 < len(command) and not command[i + 1].startswith("-") \
                and (i == 0 or command[i - 1] not in ("exec", "--name", "-f")):
            return command[i + 1:]
        if Path(word).name == "hvdtrain" and i + 1 == len(command):
            return []
    return None


def named_tests(reason: str) -> list[str]:
    """The tests a marker names: ``tests/....py`` or ``tests/....py::test_name``."""
    return re.findall(r"tests/[\w/]+\.py(?:::\w+)?", reason)
