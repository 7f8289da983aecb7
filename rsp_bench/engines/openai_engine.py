"""The ``openai`` adapter: any OpenAI-compatible server (``rsp-bench serve``, vLLM, llama.cpp's
server, ...) put through the suites, built on the official ``openai`` client.

    get_engine("openai", engine=<reference Engine>, engine_url="http://127.0.0.1:8000/v1", engine_model=None)

The URL and model come from the factory's ``engine_url`` / ``engine_model`` keywords (the
plugin's ``--rsp-engine-url`` / ``--rsp-engine-model``), else the environment variables
``RSP_ENGINE_URL`` / ``RSP_ENGINE_MODEL``; the model defaults to the server's first.

What it sends and what it can give (DESIGN.md section 8):
- generation: chat completions at temperature 0, one user message, ``logprobs`` on with vLLM's
  ``return_tokens_as_token_ids`` so the exact token ids come back; a server that ignores it gets
  its text re-tokenized with the reference tokenizer (``stats["token_ids_from_text"]``).
- knobs: ``X-Pruning-Mode`` / ``-Sensitivity`` / ``-Hardware-Watermark`` / ``-Log-Level`` headers
  from the configuration; stats (bypass ratio rows) from the ``X-Pruning-Stats`` response
  header, left out when a server does not send it.
- teacher forcing: ``/v1/completions`` with ``echo``, ``max_tokens=0`` and ``logprobs=top_n`` on
  the reference's templated prompt ids plus the continuation, with ``decode_from`` (this
  project's server then runs the continuation through its decode path, pruning applied, as
  ``Engine.teacher_forced``). A server that takes only text gets the detokenized ids and its
  ``usage.prompt_tokens`` is checked against the reference (``stats["prompt_tokens_match"]``).
  The returned [T, V] tensor holds exact log-probabilities for the server's top-N tokens and the
  forced token; the rest of the mass is spread evenly over the other tokens (``stats["known"]``
  marks the exact entries). So top-1 agreement (N >= 1) and the forced token's NLL are exact;
  a KL from this tensor is an estimate: use ``truncated_kl_per_token`` (a lower bound) and record
  it under its own name with N (``rsp_bench.quality.truncated_kl_mean`` does).

Must NOT import openai, torch or reference_engine at module import, nor rsp_bench.quality at all
(it imports the engines package, which imports this module).
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

from rsp_bench.engines.base import ConfigSpec, Output, register_engine
from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:
    import torch
    from reference_engine import Engine

DEFAULT_TOP_N = 20  # OpenAI's ceiling for top_logprobs
FORCED_CACHE = 64  # teacher-forced answers kept ([T, V] float64 each)
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def parse_stats_header(value: str | None) -> dict[str, Any] | None:
    """``X-Pruning-Stats`` -> dict with ints / floats / bools; None when absent or unreadable."""
    if not value:
        return None
    out: dict[str, Any] = {}
    try:
        for part in value.split(","):
            key, raw = part.split("=", 1)
            key = key.strip()
            if key in ("layers_bypassed", "total_tokens", "blocks"):
                out[key] = int(raw)
            elif key == "bypass_ratio":
                out[key] = float(raw)
            elif key == "degraded":
                out[key] = raw.strip().lower() == "true"
            elif key in ("degraded_reason", "detector"):
                out[key] = None if raw in ("none", "") else raw
            else:
                out[key] = raw
    except ValueError:
        return None
    return out


class OpenAIAdapter:
    """An OpenAI-compatible server behind the adapter protocol (see the module docstring)."""

    name = "openai"
    modes = ("off", "lossy", "lossless")
    batch_size = 1

    def __init__(self, engine: "Engine", url: str, served_model: str | None = None, top_n: int = DEFAULT_TOP_N,
                 timeout_s: float = 300.0, api_key: str | None = None,
                 generation_extra: dict[str, Any] | None = None) -> None:
        try:
            import openai
        except ModuleNotFoundError as exc:
            raise HarnessInputError(f"engine 'openai' needs the 'serve' extra (pip install -e '.[serve]'): {exc}") from None
        if not url or not re.match(r"^https?://", url):
            raise HarnessInputError(f"engine 'openai' needs a server URL such as http://127.0.0.1:8000/v1, got {url!r}")
        if isinstance(top_n, bool) or not isinstance(top_n, int) or not 1 <= top_n <= 20:
            raise HarnessInputError(f"top_n must be an integer in [1, 20], got {top_n!r}")
        self.engine, self.url, self.top_n = engine, url.rstrip("/"), top_n
        # Server-specific sampling fields sent with every generation, e.g. llama-cpp-python's
        # {"repeat_penalty": 1.0}: its default 1.1 changes greedy answers (not an OpenAI field).
        self.generation_extra = dict(generation_extra or {})
        self.client = openai.OpenAI(base_url=self.url, api_key=api_key or os.environ.get("OPENAI_API_KEY", "none"),
                                    max_retries=2, timeout=timeout_s)
        try:
            self.model = served_model or self.client.models.list().data[0].id
        except openai.OpenAIError as exc:
            raise HarnessInputError(f"engine 'openai': cannot list models at {self.url}: {exc}") from None
        self.token_id_prompts = True  # cleared when the server rejects a prompt of token ids
        # The last teacher-forced answers, so a suite asking again for the exact-entry mask
        # (truncated KL) does not send the request twice.
        self._forced: "OrderedDict[tuple, tuple[Any, dict[str, Any]]]" = OrderedDict()
        self.unverified: list[str] = []  # what could not be checked, for the run record
        self._by_text: dict[str, int | None] | None = None  # token text -> id (None: ambiguous)

    # ---- knobs ----
    def _headers(self, spec: ConfigSpec) -> dict[str, str]:
        if spec.mode not in self.modes:
            raise HarnessInputError(f"engine 'openai' sends modes {', '.join(self.modes)}, got {spec.mode!r} "
                                    f"in configuration {spec.config_id!r}")
        h = {"X-Pruning-Mode": spec.mode, "X-Pruning-Log-Level": "NONE"}
        if spec.sensitivity is not None:
            h["X-Pruning-Sensitivity"] = repr(float(spec.sensitivity))
        wm = getattr(spec.pruning, "hardware_watermark", None)
        if wm is not None:
            h["X-Pruning-Hardware-Watermark"] = repr(float(wm))
        return h

    def _note(self, text: str) -> None:
        if text not in self.unverified:
            self.unverified.append(text)

    # ---- generation ----
    def generate(self, prompts: list[str], max_new_tokens: int, spec: ConfigSpec) -> list[Output]:
        headers = self._headers(spec)
        outputs = []
        for prompt in prompts:
            prompt_ids = self.engine.encode(prompt, chat=True)
            t0 = time.perf_counter()
            raw = self.client.chat.completions.with_raw_response.create(
                model=self.model, messages=[{"role": "user", "content": prompt}], max_tokens=max_new_tokens,
                temperature=0, logprobs=True, top_logprobs=0, extra_headers=headers,
                extra_body={"return_tokens_as_token_ids": True, **self.generation_extra})
            elapsed = time.perf_counter() - t0
            comp = raw.parse()
            choice = comp.choices[0]
            text = choice.message.content or ""
            ids = self._ids_from_logprobs(choice)
            stats: dict[str, Any] = {"request_time_s": elapsed, "finish_reason": choice.finish_reason}
            if ids is None:
                ids = list(self.engine.tokenizer(text, add_special_tokens=False)["input_ids"])
                stats["token_ids_from_text"] = True
                stats["token_ids_checked"] = self._check_retokenized(choice, ids, comp.usage)
                if choice.finish_reason == "stop":
                    ids.append(self.engine.eos_id)
                self._note("generated token ids re-tokenized from text (server gave no token ids)")
                if not stats["token_ids_checked"]:
                    self._note("re-tokenized generated ids differ from the server's own token strings or count")
            server = parse_stats_header(raw.headers.get("x-pruning-stats"))
            if server is not None:
                stats.update(server)
            else:
                self._note("no X-Pruning-Stats header: bypass figures left out")
            n_prompt = comp.usage.prompt_tokens if comp.usage else None
            stats["prompt_tokens"] = n_prompt
            stats["prompt_tokens_match"] = n_prompt == len(prompt_ids)
            if n_prompt != len(prompt_ids):
                self._note(f"server counted {n_prompt} prompt tokens where the reference template has {len(prompt_ids)}")
            outputs.append(Output(text, ids, list(prompt_ids), stats))
        return outputs

    def stream_timings(self, prompt: str, max_new_tokens: int, spec: ConfigSpec) -> dict[str, Any]:
        """One streamed chat completion at temperature 0: its text and, client side, the time to
        the first content chunk (``ttft_s``), each content chunk's arrival (``chunk_times_s``,
        from the request's start) and the time per output token after the first (``tpot_s``,
        None with fewer than 2 chunks). A server that buffers its answer shows every chunk at
        about the same time; ``rsp-bench serve`` sends each as it is decoded."""
        t0 = time.perf_counter()
        stream = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": prompt}], max_tokens=max_new_tokens,
            temperature=0, stream=True, extra_headers=self._headers(spec), extra_body=dict(self.generation_extra))
        times, parts, pruning = [], [], None
        for chunk in stream:
            extra = getattr(chunk, "model_extra", None) or {}
            pruning = extra.get("pruning", pruning)
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter() - t0)
                parts.append(chunk.choices[0].delta.content)
        total = time.perf_counter() - t0
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        return {"text": "".join(parts), "ttft_s": times[0] if times else None, "chunk_times_s": times,
                "tpot_s": tpot, "total_s": total, "pruning": pruning}

    def _check_retokenized(self, choice: Any, ids: list[int], usage: Any) -> bool:
        """Re-tokenized ids against what the server says it generated: its per-token strings
        (logprobs content, when sent) and its ``usage.completion_tokens`` (an end-of-sequence
        token the server counts but does not print is allowed)."""
        content = getattr(getattr(choice, "logprobs", None), "content", None)
        if content:
            theirs = [e.token for e in content]
            ours = [self.engine.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
            if theirs[len(ours):] and all(not s for s in theirs[len(ours):]):
                theirs = theirs[:len(ours)]  # a special token printed as ""
            if theirs != ours:
                return False
        n = getattr(usage, "completion_tokens", None) if usage is not None else None
        return n is None or n in (len(ids), len(ids) + 1)

    def _ids_from_logprobs(self, choice: Any) -> list[int] | None:
        content = getattr(getattr(choice, "logprobs", None), "content", None)
        if not content:
            return None
        ids = []
        for entry in content:
            m = _TOKEN_ID.match(entry.token)
            if m is None:
                return None
            ids.append(int(m.group(1)))
        return ids

    # ---- teacher forcing ----
    def teacher_forced_logits(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                              spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        prompt_ids, cont = list(prompt_ids), list(continuation_ids)
        if not prompt_ids or not cont:
            raise HarnessInputError("teacher forcing needs a non-empty prompt and continuation")
        key = (tuple(prompt_ids), tuple(cont), spec.config_id)
        if key in self._forced:
            return self._forced[key]
        got = self._teacher_forced(prompt_ids, cont, spec)
        self._forced[key] = got
        while len(self._forced) > FORCED_CACHE:
            self._forced.popitem(last=False)
        return got

    def _teacher_forced(self, prompt_ids: list[int], cont: list[int],
                        spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        import openai

        full = prompt_ids + cont
        body: dict[str, Any] = {"decode_from": len(prompt_ids), "return_tokens_as_token_ids": True}
        kwargs = dict(model=self.model, max_tokens=0, echo=True, logprobs=self.top_n, temperature=0,
                      extra_headers=self._headers(spec), extra_body=body)
        stats: dict[str, Any] = {"top_n": self.top_n, "prompt_tokens_match": True}
        raw = None
        if self.token_id_prompts:
            try:
                raw = self.client.completions.with_raw_response.create(prompt=full, **kwargs)
            except (openai.BadRequestError, openai.InternalServerError, openai.UnprocessableEntityError):
                self.token_id_prompts = False
                self._note("server rejected token-id prompts: teacher forcing sent text, token counts checked")
        text_prompt = raw is None
        if text_prompt:
            # max_tokens=1, not 0: llama-cpp-python's server reads 0 as "up to the context" and
            # generates a whole answer; the one generated token is left out below.
            text = self.engine.tokenizer.decode(full, skip_special_tokens=False)
            kwargs["max_tokens"] = 1
            raw = self.client.completions.with_raw_response.create(prompt=text, **kwargs)
        comp = raw.parse()
        lp = comp.choices[0].logprobs
        n_prompt = comp.usage.prompt_tokens if comp.usage else len(lp.tokens)
        if n_prompt != len(full):
            stats["prompt_tokens_match"] = False
            self._note(f"teacher forcing: server saw {n_prompt} tokens where the reference has {len(full)}")
        # The continuation is the tail of the echoed prompt: count back from the generated tokens,
        # so a server that leaves some prompt tokens out of its echo (llama-cpp-python drops every
        # BOS-id token, and SmolLM2's BOS is <|im_start|>) still lines up.
        n_generated = (comp.usage.completion_tokens or 0) if comp.usage else kwargs["max_tokens"]
        end = len(lp.token_logprobs) - n_generated
        start = end - len(cont)
        if end != len(full):
            stats["echo_aligned_from_end"] = True
            self._note(f"teacher forcing: the server echoed {end} of {len(full)} prompt tokens; the continuation "
                       "was aligned from the end")
        if start < 1:
            raise HarnessInputError(f"server echoed {end} prompt tokens, fewer than the {len(cont)}-token continuation")
        if text_prompt:
            stats["continuation_tokens_match"] = self._tokens_match(lp.tokens[start:end], cont)
            if not stats["continuation_tokens_match"]:
                self._note("teacher forcing: the server's echoed continuation tokens differ from the reference's")
        server = parse_stats_header(raw.headers.get("x-pruning-stats"))
        if server is not None:
            stats.update(server)
        logits, known = self._dense(lp, start, cont)
        stats["known"] = known
        return logits, stats

    def _tokens_match(self, theirs: Sequence[str], cont: Sequence[int]) -> bool:
        """The server's echoed token strings against the reference's continuation ids (special
        tokens, which servers often print as "", are not compared)."""
        special = set(self.engine.tokenizer.all_special_ids)
        for s, t in zip(theirs, cont):
            if t in special:
                continue
            if s != self.engine.tokenizer.decode([t], skip_special_tokens=False):
                return False
        return len(theirs) == len(cont)

    def _token_id(self, s: str) -> int | None:
        """A listed token -> its id: ``token_id:N``, else the one vocabulary entry whose text is
        ``s``; None when no entry or several print as ``s`` (that alternative is left unlisted)."""
        m = _TOKEN_ID.match(s)
        if m:
            return int(m.group(1))
        if self._by_text is None:
            tok = self.engine.tokenizer
            texts = tok.batch_decode([[i] for i in range(self.engine.dims.vocab)], skip_special_tokens=False)
            by_text: dict[str, int | None] = {}
            for i, text in enumerate(texts):
                by_text[text] = None if text in by_text else i
            self._by_text = by_text
        return self._by_text.get(s)

    def _dense(self, lp: Any, start: int, cont: list[int]) -> tuple["torch.Tensor", "torch.Tensor"]:
        """[T, V] log-probabilities: exact where the server listed them, the remaining mass spread
        evenly elsewhere; and the [T, V] mask of exact entries."""
        import math

        import torch

        V = self.engine.dims.vocab
        T = len(cont)
        rows = torch.empty(T, V, dtype=torch.float64)
        known = torch.zeros(T, V, dtype=torch.bool)
        for t in range(T):
            pos = start + t
            if pos >= len(lp.token_logprobs):
                raise HarnessInputError(f"server returned {len(lp.token_logprobs)} prompt logprobs, needed {start + T}")
            entries: dict[int, float] = {}
            for s, v in (lp.top_logprobs[pos] or {}).items():
                i = self._token_id(s)
                if i is not None and v is not None:
                    entries[i] = float(v)
            if lp.token_logprobs[pos] is not None:
                entries[cont[t]] = float(lp.token_logprobs[pos])
            mass = sum(math.exp(v) for v in entries.values())
            rest = max(1.0 - mass, 1e-300)
            rows[t] = math.log(rest / max(V - len(entries), 1))
            for i, v in entries.items():
                rows[t, i] = v
                known[t, i] = True
        return rows, known


def truncated_kl_per_token(reference_logits: "torch.Tensor", candidate_logprobs: "torch.Tensor",
                           known: "torch.Tensor") -> "torch.Tensor":
    """KL(P_ref || P_cand) per position after merging every token the server did not list into
    one bucket (nats, float64). Merging outcomes never increases a KL (data-processing
    inequality), so this is a lower bound on the full-vocabulary KL, and 0 when the listed
    probabilities agree exactly. ``known`` [T, V] marks the exact entries of ``candidate_logprobs``."""
    import torch

    log_p = torch.log_softmax(reference_logits.to(torch.float64), dim=-1)
    p = log_p.exp()
    q = candidate_logprobs.to(torch.float64).exp()
    k = known.to(torch.bool)
    listed = torch.where(k & (p > 0), p * (log_p - candidate_logprobs.to(torch.float64)), torch.zeros_like(p)).sum(-1)
    p_rest = (1.0 - torch.where(k, p, torch.zeros_like(p)).sum(-1)).clamp_min(0.0)
    q_rest = (1.0 - torch.where(k, q, torch.zeros_like(q)).sum(-1)).clamp_min(1e-300)
    bucket = torch.where(p_rest > 0, p_rest * (torch.log(p_rest.clamp_min(1e-300)) - torch.log(q_rest)),
                         torch.zeros_like(p_rest))
    return (listed + bucket).clamp_min(0.0)


class ServedProcess:
    """``rsp-bench serve`` as a child process on a free port of 127.0.0.1, stopped with SIGTERM.

    ``with ServedProcess(["--hardware-watermark", "0"]) as url:`` gives ``http://127.0.0.1:PORT``.
    """

    def __init__(self, args: Sequence[str] = (), start_timeout_s: float = 600.0,
                 env: dict[str, str] | None = None) -> None:
        self.args, self.start_timeout_s, self.env = list(args), start_timeout_s, env
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.tail: list[str] = []

    def __enter__(self) -> str:
        self.proc = subprocess.Popen([sys.executable, "-m", "rsp_bench.cli", "serve", "--host", "127.0.0.1",
                                      "--port", "0", *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self._env())
        found = threading.Event()

        def read() -> None:  # keeps the pipe drained for the server's whole life
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self.tail = (self.tail + [line])[-40:]
                m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
                if m and not found.is_set():
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        found.wait(self.start_timeout_s)
        if self.url is None:
            self.stop()
            raise HarnessInputError("rsp-bench serve did not start:\n" + "".join(self.tail[-20:]))
        return self.url

    def _env(self) -> dict[str, str]:
        """The child's environment: the parent's torch thread count as OMP_NUM_THREADS unless set.
        A pytest-xdist worker pins torch to its share of the cores; a server child left at the
        default would reduce floats in another order than the in-process engine it is compared
        with, and a lossy router decision at its threshold can flip on the last bit."""
        env = dict(os.environ if self.env is None else self.env)
        torch = sys.modules.get("torch")
        if torch is not None and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
        return env

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (another process may take it before it is used)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ExternalServer:
    """Any OpenAI-compatible server started as ``cmd + ["--host", "127.0.0.1", "--port", PORT]``
    (llama-cpp-python's ``python -m llama_cpp.server`` takes those), ready when ``GET /v1/models``
    answers 200, stopped with SIGTERM. ``with ExternalServer(cmd) as url:`` gives ``http://127.0.0.1:PORT``."""

    def __init__(self, cmd: Sequence[str], start_timeout_s: float = 300.0, env: dict[str, str] | None = None) -> None:
        self.cmd, self.start_timeout_s, self.env = list(cmd), start_timeout_s, env
        self.proc: subprocess.Popen | None = None
        self.tail: list[str] = []

    def __enter__(self) -> str:
        import httpx

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([*self.cmd, "--host", "127.0.0.1", "--port", str(port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=self.env)

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.tail = (self.tail + [line])[-40:]

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(url + "/v1/models", timeout=2.0).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise HarnessInputError(f"{' '.join(self.cmd[:3])} did not start on {url}:\n" + "".join(self.tail[-20:]))

    stop = ServedProcess.stop

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@register_engine("openai", modes=OpenAIAdapter.modes)
def _openai_factory(engine: "Engine | None" = None, engine_url: str | None = None, engine_model: str | None = None,
                    top_n: int = DEFAULT_TOP_N, **_: Any) -> OpenAIAdapter:
    """Built by the plugin with ``engine_url`` / ``engine_model`` (--rsp-engine-url / --rsp-engine-model)."""
    from rsp_bench.engines.reference import need_engine

    url = engine_url or os.environ.get("RSP_ENGINE_URL")
    served_model = engine_model
    if not url:
        raise HarnessInputError("engine 'openai' needs a server URL: --rsp-engine-url http://HOST:PORT/v1 "
                                "(or the environment variable RSP_ENGINE_URL)")
    return OpenAIAdapter(need_engine("openai", engine), url, served_model or os.environ.get("RSP_ENGINE_MODEL"),
                         top_n)
