"""Registers the fixtures and hooks the tests share; they live in tests/support (see its docstring)."""

pytest_plugins = ["tests.support.s3", "tests.support.throttle", "tests.support.ckpt", "tests.support.cluster",
                  "tests.support.cli", "tests.support.references"]
