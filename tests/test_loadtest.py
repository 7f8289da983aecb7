"""rsp_bench.loadtest without a model: its figures and input checks, and the CLI wiring. The
end-to-end load (a real server, 4 clients, 12 requests, the 429 burst) is in suites/test_served.py."""

from __future__ import annotations

import pytest

from rsp_bench import loadtest
from rsp_bench.errors import HarnessInputError
from rsp_bench.load_client import int_or_none


def test_percentile_interpolates():
    assert loadtest._percentile([], 0.5) is None
    assert loadtest._percentile([3.0], 0.99) == 3.0
    assert loadtest._percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert loadtest._percentile(list(map(float, range(101))), 0.99) == pytest.approx(99.0)


def test_bypass_ratio_weights_by_tokens_and_needs_stats():
    rows = [{"pruning": {"layers_bypassed": 3, "total_tokens": 2, "blocks": 30}},
            {"pruning": {"layers_bypassed": 0, "total_tokens": 8, "blocks": 30}}]
    assert loadtest._bypass(rows) == pytest.approx(3 / 300)
    assert loadtest._bypass([{"pruning": None}]) is None  # no X-Pruning-Stats: left out


@pytest.mark.parametrize("kw", [{"requests": 0}, {"clients": -1}, {"max_tokens": True}, {"requests": 1.5}])
def test_config_rejects_bad_sizes(kw):
    with pytest.raises(HarnessInputError):
        loadtest.LoadConfig(["hi"], **kw)
    with pytest.raises(HarnessInputError):
        loadtest.LoadConfig([])


def test_cli_wires_loadtest(capsys):
    from rsp_bench.cli import main

    with pytest.raises(SystemExit) as info:
        main(["loadtest", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--clients" in out and "--max-queue" in out and "--url" in out and "--max-batch" in out


def test_batching_figures_from_batch_size_headers():
    rows = [{"batch_size": 1}, {"batch_size": 4}, {"batch_size": 4}, {"batch_size": None}]
    b = loadtest._batching(rows)
    assert b["reported"] == 3 and b["sizes"] == {"1": 1, "4": 2}
    assert b["mean"] == pytest.approx(3.0) and b["batched_share"] == pytest.approx(2 / 3)
    assert loadtest._batching([{"batch_size": None}]) == {"reported": 0, "sizes": {}, "mean": None, "batched_share": None}
    assert int_or_none("8") == 8 and int_or_none("x") is None and int_or_none(None) is None


def test_equality_is_enforced_unless_lossy_rows_were_batched():
    batched, alone, unknown = [{"batch_size": 3}], [{"batch_size": 1}], [{"batch_size": None}]
    for mode in ("off", "static", "lossless", "OFF"):
        assert loadtest.must_equal_single(mode, batched)  # batch-invariant: a mismatch is a failure
    assert not loadtest.must_equal_single("lossy", batched)  # pruned with its neighbours: measured
    assert loadtest.must_equal_single("lossy", alone) and loadtest.must_equal_single("lossy", unknown)
    assert loadtest.must_equal_single(None, alone)


def test_soak_refuses_unbounded_runs_and_is_wired_to_the_cli(capsys):
    from rsp_bench import soak
    from rsp_bench.cli import main

    with pytest.raises(HarnessInputError):
        soak.run_soak("http://127.0.0.1:9/v1", loadtest.LoadConfig(["hi"]), 0, 10)
    with pytest.raises(HarnessInputError):
        soak.run_soak("http://127.0.0.1:9/v1", loadtest.LoadConfig(["hi"]), 5, 0)
    # every planted bad request names what it expects, and the statuses are client errors
    assert {status for *_, status, _ in soak.BAD_REQUESTS} <= {200, 400, 404}
    assert len({name for name, *_ in soak.BAD_REQUESTS}) == len(soak.BAD_REQUESTS)
    with pytest.raises(SystemExit):
        main(["loadtest", "--help"])
    out = capsys.readouterr().out
    assert "--soak" in out and "--soak-requests" in out and "--api-key" in out


def test_api_key_becomes_a_bearer_header():
    cfg = loadtest.LoadConfig(["hi"], api_key="k1")
    assert cfg.headers["Authorization"] == "Bearer k1"
    assert "Authorization" not in loadtest.LoadConfig(["hi"]).headers


@pytest.fixture
def locked_server():
    """A server on 127.0.0.1 that answers every request 401, as one started with an API key does
    to a client that sends none."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Locked(BaseHTTPRequestHandler):
        def _deny(self) -> None:
            body = b'{"error": {"message": "missing API key"}}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _deny

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Locked)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("extra", [[], ["--model", "m"]])  # --model skips /models: the first chat call is refused
def test_a_server_wanting_a_key_exits_2_with_the_api_key_hint(tmp_path, capsys, locked_server, extra):
    from rsp_bench.cli import main

    out = tmp_path / "lt.json"
    assert main(["loadtest", "--url", locked_server, "--out", str(out), "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert "401" in err and "--api-key" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("url, named", [
    ("http://127.0.0.1:1/v1", "cannot reach http://127.0.0.1:1/v1/models"),  # nothing listens on port 1
    ("notaurl", "--url 'notaurl' is not a server URL"),
    ("ftp://127.0.0.1/v1", "--url 'ftp://127.0.0.1/v1' is not a server URL"),
    ("http://127.0.0.1:port/v1", "--url 'http://127.0.0.1:port/v1' is not a server URL"),
])
def test_an_unreachable_or_bad_url_exits_2_naming_it(tmp_path, capsys, url, named):
    from rsp_bench.cli import main

    out = tmp_path / "lt.json"
    assert main(["loadtest", "--url", url, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
