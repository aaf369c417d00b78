"""The throttling S3 proxy's config (tools/local_s3/throttle_proxy.py): what it accepts, what it refuses (one line
naming where and the key), and what it decides."""

from __future__ import annotations

import pytest

from tools.local_s3.throttle_proxy import (
    BadConfig,
    Config,
    Counters,
    Throttle,
    config_from_args,
    parse_upstream,
    parser,
)


def test_a_config_changes_only_the_keys_given():
    c = Config().updated({"share": 0.5, "methods": ["get", "PUT"], "paths": r"\.distcp$", "retry_after": None}, "x")
    assert c == Config(share=0.5, methods=("GET", "PUT"), paths=r"\.distcp$", retry_after=None)
    assert c.updated({"latency": 0.25}, "x") == Config(share=0.5, methods=("GET", "PUT"), paths=r"\.distcp$",
                                                        retry_after=None, latency=0.25)
    assert Config().updated({"rate": 100, "burst": 3}, "x") == Config(rate=100.0, burst=3.0)


@pytest.mark.parametrize(("changes", "problem"), [
    ({"shar": 0.5}, "POST /__proxy__/config: unknown key 'shar' (known: burst, hold, latency, methods, paths, rate, "
                    "retry_after, share)"),
    ({"share": 1.5}, "POST /__proxy__/config: share: must be within [0, 1], got 1.5"),
    ({"share": True}, "POST /__proxy__/config: share: expected a number, got True"),
    ({"share": "0.5"}, "POST /__proxy__/config: share: expected a number, got '0.5'"),
    ({"rate": 0}, "POST /__proxy__/config: rate: must be > 0 (null: no limit), got 0"),
    ({"burst": 0.5}, "POST /__proxy__/config: burst: must be within [1, inf], got 0.5"),
    ({"methods": "GET"}, "POST /__proxy__/config: methods: expected a list of methods, got 'GET'"),
    ({"methods": ["GET", "PATCH"]}, "POST /__proxy__/config: methods: unknown method 'PATCH' (known: GET, PUT, POST, "
                                    "DELETE, HEAD)"),
    ({"paths": "("}, "POST /__proxy__/config: paths: not a regular expression (missing ), unterminated subpattern at "
                     "position 0): '('"),
    ({"retry_after": -1}, "POST /__proxy__/config: retry_after: expected whole seconds >= 0 (null: no header), got -1"),
    ({"retry_after": 1.5}, "POST /__proxy__/config: retry_after: expected whole seconds >= 0 (null: no header), "
                           "got 1.5"),
    ({"latency": -0.1}, "POST /__proxy__/config: latency: must be within [0, inf], got -0.1"),
])
def test_a_bad_value_is_one_line_naming_where_and_the_key(changes, problem):
    with pytest.raises(BadConfig) as e:
        Config().updated(changes, "POST /__proxy__/config")
    assert str(e.value) == problem


def test_not_an_object_is_refused():
    with pytest.raises(BadConfig, match=r"^--config: expected a JSON object, got list$"):
        Config().updated([1], "--config")  # type: ignore[arg-type]


def test_flags_then_config_json():
    args = parser().parse_args(["--upstream", "http://127.0.0.1:1", "--share", "0.2", "--methods", "GET, PUT",
                                "--retry-after", "-1", "--config", '{"share": 0.7, "latency": 0.01}'])
    assert config_from_args(args) == Config(share=0.7, methods=("GET", "PUT"), retry_after=None, latency=0.01)
    with pytest.raises(BadConfig, match=r"^flags: share: must be within \[0, 1\], got 2.0$"):
        config_from_args(parser().parse_args(["--upstream", "http://127.0.0.1:1", "--share", "2"]))
    with pytest.raises(BadConfig, match=r"^--config: not JSON: "):
        config_from_args(parser().parse_args(["--upstream", "http://127.0.0.1:1", "--config", "{share"]))


@pytest.mark.parametrize("url", ["http://127.0.0.1:8333", "http://localhost:8333", "http://[::1]:8333"])
def test_the_upstream_is_on_loopback(url):
    assert parse_upstream(url)[1] == 8333


@pytest.mark.parametrize("url", ["http://10.0.0.1:8333", "https://127.0.0.1:8333", "http://s3.amazonaws.com"])
def test_any_other_upstream_is_refused(url):
    with pytest.raises(BadConfig, match="^--upstream: expected http://<loopback address>:<port>, got "):
        parse_upstream(url)


def test_the_share_is_drawn_only_for_matching_requests():
    t = Throttle(Config(share=0.5, methods=("GET",), paths=r"\.distcp"), seed=0)
    draws = [t.decide("GET", f"/b/run/step-1/__{i}_0.distcp") for i in range(1000)]
    assert 400 < sum(draws) < 600
    assert not any(t.decide(m, p) for m, p in [("PUT", "/b/run/step-1/__0_0.distcp"), ("GET", "/b/run/commit.json"),
                                                ("GET", "/b?list-type=2&prefix=run/")])
    t.set(Config(share=1.0))
    assert all(t.decide("HEAD", "/b/x") for _ in range(10))


def test_the_rate_is_a_token_bucket_per_prefix():
    t = Throttle(Config(rate=10.0, burst=3.0))
    assert [t.decide("GET", "/b/run/step-1/f", now=0.0) for _ in range(4)] == [False, False, False, True]
    assert not t.decide("GET", "/b/run/step-2/f", now=0.0)  # another prefix, another bucket
    assert t.decide("GET", "/b/run/step-1/g", now=0.05)  # half a token back: still none
    assert not t.decide("GET", "/b/run/step-1/g", now=0.1)  # one token back
    assert [t.decide("GET", "/b/run/step-1/f", now=10.0) for _ in range(4)] == [False, False, False, True]  # burst


def test_a_kept_request_says_who_asked():
    counters = Counters(keep=True)
    counters.answered("HEAD", "/b/k", 503, 0, user_agent="Boto3/1.40 md/Botocore#1.43 client/17 cfg/retry-mode#std")
    counters.answered("PUT", "/b/k?partNumber=1", 200, 5)
    assert [(r.method, r.status, r.client) for r in counters.requests] == [("HEAD", 503, "17"), ("PUT", 200, "")]
