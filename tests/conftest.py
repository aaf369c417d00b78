"""Registers the fixtures and hooks the tests share; they live in tests/support (see its docstring)."""

import pytest

pytest_plugins = ["tests.support.s3", "tests.support.throttle", "tests.support.ckpt", "tests.support.cluster",
                  "tests.support.cli", "tests.support.references"]

FIRST = ("tests/unit/test_lint.py",)
"""Tests of one long process that are collected last: run first, beside the first jobs, so that the suite does not
end with three workers idle while one of them runs mypy (~25 s). pytest-xdist hands the tests out in this order."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: the rest keep their order
