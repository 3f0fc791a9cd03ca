"""mkdocs hooks: the site also shows ``benchmarks/README.md`` and the files under
``examples/``, which live outside ``docs/``; the docstrings' reST roles (:class:`X`) show as
plain code in the API reference.

The pages link to it as ``../benchmarks/README.md`` (right when read on a forge or in a
checkout); on the site that page is ``benchmark-suite.md``, generated from the README, whose own
link back to ``../docs/benchmarks.md`` becomes ``benchmarks.md``. A page's link to
``../examples/X`` (right on a forge too) becomes ``examples/X``, a copy of the file on the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
SUITE = "benchmark-suite.md"
EXAMPLES = ROOT / "examples"
ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):<code>(~?)([^<]+)</code>")


def on_files(files: Files, config: Any) -> Files:
    content = (ROOT / "benchmarks" / "README.md").read_text()
    files.append(File.generated(config, SUITE, content=content))
    for path in sorted(EXAMPLES.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            uri = path.relative_to(ROOT).as_posix()
            files.append(File.generated(config, uri, content=path.read_bytes()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri == SUITE:
        return markdown.replace("](../docs/", "](")
    # a page in a subfolder (operations/) climbs one more level to the README and to the suite
    depth = page.file.src_uri.count("/")
    up = "../" * depth
    markdown = markdown.replace(f"]({up}../examples/", f"]({up}examples/")
    return markdown.replace(f"]({up}../benchmarks/README.md)", f"]({up}{SUITE})")


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    def code(m: re.Match[str]) -> str:
        name = m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)
        return f"<code>{name}</code>"
    return ROLE.sub(code, html)
