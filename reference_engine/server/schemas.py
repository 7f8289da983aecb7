"""Request and response bodies of the OpenAI-compatible server, declared once as pydantic models.

The request models accept the fields OpenAI clients send and ignore the rest (``extra="allow"``:
the official client and lm-eval send fields this server has no use for, e.g. ``user``); a field
this server reads is validated here, so a bad value is a 400 naming it before any engine work
(limits.parse_body). The OpenAI sampling fields this engine does not implement (``top_p``,
penalties, ``logit_bias``, ``response_format``, ``tools``...) are declared too, so that
limits.refuse_unsupported can refuse them by name unless they carry their neutral value.
Two extensions beyond the OpenAI API, both optional: the ``pruning`` object (per-request knobs,
see knobs.py) and, on completions, ``decode_from`` (prompt tokens from that index on are fed
through the engine's decode path, pruning applied, as ``Engine.teacher_forced`` does; earlier
ones are prefilled in full) plus vLLM's ``return_tokens_as_token_ids``.

Must not import torch, the engine or the harness: these are plain data.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

MAX_TOP_LOGPROBS = 20  # OpenAI's own limit for top_logprobs


class PruningBody(BaseModel):
    """Per-request pruning knobs in the body; each overrides the header of the same name."""

    model_config = ConfigDict(extra="forbid")
    sensitivity: float | None = None
    blacklist: Union[list[int], str, None] = None  # a list of block indices or a comma list
    log_level: str | None = None
    mode: str | None = None
    router: str | None = None
    hardware_watermark: float | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    # OpenAI's roles; any other is a 400 naming it, as OpenAI answers (the template would take it).
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[ContentPart], None] = None

    def text(self, where: str) -> str:
        """The content as one string (None: ""); OpenAI content parts must be text parts.
        Raises ValueError naming ``where`` for any other part."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for i, part in enumerate(self.content):
            if part.type != "text":
                raise ValueError(f"{where}.{i}: content part type {part.type!r} is not supported (text only)")
            texts.append(part.text or "")
        return "".join(texts)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    temperature: float | None = Field(default=0.0, ge=0.0, le=2.0)
    # torch's generator takes a seed in [-2**63, 2**64); beyond that it raised (a 500)
    seed: StrictInt | None = Field(default=None, ge=-(2 ** 63), lt=2 ** 64)
    stop: Union[str, list[str], None] = None
    # Strict: "stream": "yes" or "max_tokens": "2" (or true) is a 400, as OpenAI answers, not coerced.
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, le=1)  # one choice per prompt: the engine decodes greedily
    pruning: PruningBody | None = None
    user: str | None = None
    # Declared so that they can be refused by name (limits.refuse_unsupported), not ignored.
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    functions: list[dict[str, Any]] | None = None
    function_call: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    return_tokens_as_token_ids: StrictBool = False  # vLLM's extension: logprob tokens as "token_id:N"


PromptType = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(_Common):
    prompt: PromptType
    max_tokens: StrictInt = Field(default=16, ge=0)
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    decode_from: StrictInt | None = Field(default=None, ge=1)
    return_tokens_as_token_ids: StrictBool = False
    best_of: int | None = None
    suffix: str | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]


# ---------------------------------------------------------------- responses


class PruningStats(BaseModel):
    layers_bypassed: int
    total_tokens: int
    bypass_ratio: float
    degraded: bool
    degraded_reason: str | None
    mode: str
    sensitivity: float
    blocks: int
    batch_size: int = 1  # requests decoded together with this one (1: alone); see runner.py
    detector: str | None = None  # the degradation detector that judged the prompt (None: no check ran)
    router: str | None = None  # the lossy router that decided ("block" or "unit"; None: none ran)
    router_fallback: str | None = None  # why the router asked for did not run (no unit predictor), or None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    pruning: PruningStats


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str
    # Extension: the engine's own stats for this choice (the response's ``pruning`` sums them).
    pruning: PruningStats | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    pruning: PruningStats


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorBody


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    tokenizer_class: str
    eos_token: str | None
    bos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str | None
    model_max_length: int
    vocab_size: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "rsp-bench"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    """``status`` "ok", or "down" (a 503) when the engine worker died or hung."""

    status: Literal["ok", "down"]
    model: str
    worker_alive: bool
    down_reason: str | None = None
    queue_depth: int   # admitted requests: preparing, waiting or running
    waiting: int       # of those, queued for the engine
    max_queue: int
