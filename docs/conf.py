"""Sphinx configuration of hvdtrain's documentation (``make docs``: docs/_build/html)."""

import re
import sys
from pathlib import Path

from sphinx.util import logging

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout's hvdtrain and recipes, installed or not

from hvdtrain import __version__  # noqa: E402

logger = logging.getLogger(__name__)

project = "hvdtrain"
author = "hvdtrain developers"
copyright = "hvdtrain developers"
release = version = __version__

extensions = [
    "myst_nb",  # MyST Markdown pages (myst-parser) and notebooks (examples/quickstart.ipynb)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_click",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "screenshots", "generate.py"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) resolves to a heading's slug

# notebooks render with the outputs stored in them: nothing is executed at build time (the quickstart
# notebook trains on 2 workers; tests/integration/test_notebook.py executes it in a real kernel)
nb_execution_mode = "off"
nb_merge_streams = True  # a cell's stdout lines (written by several workers) as one block

# every internal reference (page, heading anchor, file) must resolve: -W turns a missing one into an error

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# the frameworks are not needed to document the API: the public API's modules import neither at import time
autodoc_mock_imports = ["torch", "tensorflow", "keras"]

html_theme = "furo"
html_title = f"hvdtrain {release}"
html_static_path = []

# BENCHMARKS.md and RELIABILITY.md live at the repository's root and are included as pages: a link
# of theirs to a file that is not a page (a script, a JSON result) becomes the file's path as code
# here, once the file is found (beside the included page, or under benchmarks/ where the benchmark
# scripts live); so does a link to a Markdown file outside docs/ (the dated reports under reports/, read
# on GitHub); a link to a file that exists nowhere fails the build, as a broken page link does.
_LOCAL_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((?!https?://|#|mailto:)([^)#\s]+)(#[^)\s]*)?\)")


def _file_links(app, relative_path, parent_docname, content):
    path = Path(app.srcdir, relative_path).resolve() if not Path(relative_path).is_absolute() else Path(relative_path)

    def code(match):
        text, target = match.group(1), match.group(2)
        if target.endswith(".md") and (path.parent / target).resolve().is_relative_to(Path(app.srcdir).resolve()):
            return match.group(0)  # a page of the site
        for base in (path.parent, REPO / "benchmarks"):
            if (base / target).exists():
                shown = (base / target).relative_to(REPO).as_posix()
                return text if text.strip("`") == shown else f"{text} (`{shown}`)"
        logger.warning("%s links to %s, which does not exist", path.name, target, location=parent_docname)
        return match.group(0)

    content[0] = _LOCAL_LINK.sub(code, content[0])


def setup(app):
    app.connect("include-read", _file_links)
