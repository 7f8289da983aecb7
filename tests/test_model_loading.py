"""reference_engine.model_loading: converting a GGUF into the cache (no model needed: the conversion
itself is faked).

Must NOT import torch at module level.
"""

from __future__ import annotations


def test_concurrent_conversions_convert_once(tmp_path, monkeypatch):
    """Two processes starting on a cold cache (rsp-bench ab's workers) used to convert the same GGUF
    at once, and the second one's rename deleted the folder the first was loading from."""
    import threading
    import time

    from reference_engine import model_loading as ml

    monkeypatch.setenv("RSP_BENCH_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    calls = []

    def fake_convert(src, target):
        calls.append(target)
        time.sleep(0.2)  # long enough for the other thread to arrive while this one converts
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"w")

    monkeypatch.setattr(ml, "_convert_gguf", fake_convert)
    got = []
    threads = [threading.Thread(target=lambda: got.append(ml._cached_conversion(gguf))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 2 and got[0] == got[1]
    assert (got[0] / "model.safetensors").is_file()
