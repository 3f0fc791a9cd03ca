"""The package root holds its public modules; the engine's private ones live in
consumerkit/engine/ and the helpers it shares in consumerkit/shared/."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "consumerkit"


def private_root_modules(package: Path) -> list[str]:
    return sorted(p.name for p in package.glob("_*.py")
                  if not (p.name.startswith("__") and p.name.endswith("__.py")))


def test_the_root_holds_no_private_modules() -> None:
    assert (PACKAGE / "engine" / "pipeline.py").is_file()
    assert private_root_modules(PACKAGE) == [], (
        "private modules belong in consumerkit/engine/ (the flow) or consumerkit/shared/")


def test_the_check_finds_a_private_module(tmp_path: Path) -> None:
    for name in ("__init__.py", "__main__.py", "consumer.py", "_stray.py"):
        (tmp_path / name).write_text("")
    assert private_root_modules(tmp_path) == ["_stray.py"]
