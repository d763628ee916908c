"""Every code block of README.md and the docs pages either runs in CI or says why not
(tests/docsnippets.py has the convention), and every hvdtrain command the pages show parses: a
``hvdtrain recipe`` command resolves its config (``--keys``: flags, keys, values, the rulebook), other
subcommands parse their options. ``console`` blocks print what they show; ``yaml`` blocks are configs
hvdtrain accepts. No training here: tests/integration/test_doc_snippets.py executes the runnable blocks."""

from __future__ import annotations

import contextlib
import re

import click
import pytest
from click.testing import CliRunner

import docsnippets
from docsnippets import REPO

SNIPPETS = docsnippets.every_snippet()
SHELL = [s for s in SNIPPETS if s.lang == "bash"]


def _ids(snippets):
    return [s.where for s in snippets]


def test_the_pages_have_snippets_of_every_kind():
    langs = {s.lang for s in SNIPPETS}
    assert {"bash", "python", "console", "yaml", "text"} <= langs, langs
    assert any(s.runs for s in SNIPPETS) and any(s.marker == "not run in CI" for s in SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=_ids(SNIPPETS))
def test_every_block_runs_or_says_why_not(snippet):
    allowed = (*docsnippets.RUNNABLE, *docsnippets.CHECKED, *docsnippets.LISTING, *docsnippets.MARKABLE)
    assert snippet.lang != docsnippets.INDENTED, f"{snippet.where}: an indented code block: fence it with a language"
    assert snippet.lang in allowed, (f"{snippet.where}: a ```{snippet.lang} block: use one of {allowed} "
                                     "(tests/docsnippets.py)")
    if snippet.lang in docsnippets.MARKABLE and snippet.lang not in (*docsnippets.RUNNABLE, *docsnippets.CHECKED):
        assert snippet.marker, f"{snippet.where}: a ```{snippet.lang} block runs nowhere: mark it '# not run in CI: REASON'"
    if snippet.marker:
        assert snippet.reason, f"{snippet.where}: '# {snippet.marker}' needs a reason"
    named = docsnippets.named_tests(snippet.reason)
    if snippet.marker == "run in CI by":
        assert named, f"{snippet.where}: '# run in CI by' names no test (tests/PATH.py[::test_name])"
    for name in named:
        path, _, function = name.partition("::")
        assert (REPO / path).is_file(), f"{snippet.where}: names {name}, which does not exist"
        if function:
            assert re.search(rf"^\s*(async )?def {function}\(", (REPO / path).read_text(), re.M), \
                f"{snippet.where}: {path} has no test {function}"


def _cli(args):
    """``hvdtrain ARGS`` in this process, from the repository's root (the pages' relative paths)."""
    from hvdtrain.cli import main

    with contextlib.chdir(REPO):
        return CliRunner().invoke(main, args, catch_exceptions=False)


COMMANDS = [(s, args) for s in SHELL for command in docsnippets.shell_commands(s.text)
            if (args := docsnippets.hvdtrain_args(command))]


@pytest.mark.parametrize("snippet,args", COMMANDS, ids=[f"{s.where}:{' '.join(a[:2])}" for s, a in COMMANDS])
def test_every_hvdtrain_command_shown_parses(snippet, args):
    from hvdtrain.cli import main

    if args[0] == "recipe":
        result = _cli([*args, "--keys"])
        assert result.exit_code == 0, f"{snippet.where}: hvdtrain {' '.join(args)} --keys:\n{result.output}"
        return
    ctx = main.make_context("hvdtrain", list(args), resilient_parsing=False)
    command = main.get_command(ctx, args[0])
    assert command is not None, f"{snippet.where}: hvdtrain has no command {args[0]}"
    try:
        command.make_context(args[0], list(args[1:]), parent=ctx)
    except click.BadParameter as exc:  # a path the page names exists on the user's machine, not here
        assert "does not exist" in exc.format_message(), f"{snippet.where}: hvdtrain {' '.join(args)}: {exc}"
    except click.UsageError as exc:
        pytest.fail(f"{snippet.where}: hvdtrain {' '.join(args)}: {exc.format_message()}")


CONSOLE = [s for s in SNIPPETS if s.lang == "console"]


def _console_steps(text):
    steps = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


@pytest.mark.parametrize("snippet", CONSOLE, ids=_ids(CONSOLE))
def test_console_blocks_print_what_they_show(snippet):
    import shlex

    steps = _console_steps(snippet.text)
    assert steps, f"{snippet.where}: a console block without '$ command' lines"
    for command, expected in steps:
        args = docsnippets.hvdtrain_args(shlex.split(command))
        assert args, f"{snippet.where}: '{command}': console blocks show hvdtrain commands"
        output = _cli(args).output
        for line in filter(None, expected):
            pattern = ".*".join(re.escape(part) for part in line.split("..."))  # "..." stands for any text
            assert any(re.fullmatch(pattern, printed) for printed in output.splitlines()), \
                f"{snippet.where}: '{command}' printed\n{output}\nnot the line\n{line}"


YAML = [s for s in SNIPPETS if s.lang == "yaml" and not s.marker]


@pytest.mark.parametrize("snippet", YAML, ids=_ids(YAML))
def test_yaml_blocks_are_configs_hvdtrain_accepts(snippet, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(snippet.text)
    result = _cli(["recipe", "image-classification", "--config", str(config), "--keys"])
    assert result.exit_code == 0, f"{snippet.where}:\n{result.output}"
