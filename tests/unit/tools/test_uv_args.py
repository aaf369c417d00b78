"""tools/uv_args.py: pip's configuration, as `pip config list` prints it, becomes uv's install options."""

from tools.uv_args import pip_settings, uv_args

LISTING = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/other'
"""


def test_pip_settings_keep_the_last_value_of_each_option() -> None:
    assert pip_settings(LISTING) == {"cert": "/etc/ssl/certs/ca-certificates.crt", "find-links": "/opt/other",
                                     "constraint": "/etc/xdg/pip/constraints.txt",
                                     "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple"}


def test_uv_gets_every_index_link_and_constraint() -> None:
    assert uv_args(pip_settings(LISTING)) == [
        "--index-strategy", "unsafe-best-match",
        "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/other", "--constraint", "/etc/xdg/pip/constraints.txt", "--native-tls"]


def test_an_index_url_replaces_pypi_and_nothing_configured_adds_nothing() -> None:
    assert uv_args({"index-url": "https://mirror/simple"})[2:] == ["--index-url", "https://mirror/simple"]
    assert uv_args(pip_settings("")) == ["--index-strategy", "unsafe-best-match"]
