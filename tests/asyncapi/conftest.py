from __future__ import annotations

import pytest

from .parser import AsyncApiParser, install


@pytest.fixture(scope="session")
def asyncapi_parser() -> AsyncApiParser:
    return install()
