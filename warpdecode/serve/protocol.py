"""Request bodies of the OpenAI API that the server reads, and OpenAI's error shape.

Bodies are parsed strictly: a wrong type (`"max_tokens": "5"`), a value out of range or a field the
server does not know is a 400 that names the field, as OpenAI's own API answers. Fields of the API
that the server accepts but cannot honour yet (tools, `logit_bias` ...) are refused by
name rather than ignored, so a client never gets an answer to a question it did not ask.

Extension field: `speculation`, a method spec `NAME[:KEY=VALUE...]` (decoding/specs.py), picks the
decoding method of one request; the server's `--method` is the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ErrorType = Literal["invalid_request_error", "not_found_error", "rate_limit_error", "server_error", "unavailable_error"]


class ApiError(Exception):
    """An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type: ErrorType = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class JsonSchemaFormat(_Strict):
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's `response_format` (`text`, `json_object`, `json_schema`) and, as extensions,
    warpdecode's `regex`, `grammar` (Lark or GBNF) and `choice` (docs/structured-output.md)."""

    type: Literal["text", "json_object", "json_schema", "regex", "grammar", "choice"]
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = None
    grammar: str | None = None
    choices: list[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The format as `generate(response_format=...)` takes it."""
        out = self.model_dump(exclude_none=True, by_alias=True)
        if self.json_schema is not None:
            out["json_schema"] = self.json_schema.model_dump(exclude_none=True, by_alias=True)
        return out


class _Sampling(_Strict):
    """The fields both endpoints share."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    """An extension, as in vLLM and SGLang: sample among the k most likely tokens (0 or none: all)."""
    n: int = Field(1, ge=1, le=128)
    """Choices to generate: n requests' worth of work when sampling (choice i seeded `seed` + i); greedy
    choices are one decoding copied n times."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    speculation: str | None = None
    """The decoding method of this request, `NAME[:KEY=VALUE...]` (default: the server's --method)."""
    response_format: ResponseFormat | None = None
    close_at_budget: bool = False
    """An extension: close a constrained output that `max_tokens` would cut with a completion of its
    `response_format` within the budget (valid JSON); `finish_reason` stays `length`
    (docs/structured-output.md)."""

    def check_common(self) -> None:
        """Refuse what the server accepts in the schema but cannot honour."""
        if self.close_at_budget and (self.response_format is None or self.response_format.type == "text"):
            raise bad_request("close_at_budget closes a constrained output: it needs a response_format",
                              "close_at_budget")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported yet", "logit_bias")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > 4:
            raise bad_request(f"stop takes at most 4 sequences, got {len(stops)}", "stop")
        if any(not s for s in stops):
            raise bad_request("stop sequences must be non-empty strings", "stop")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream: true", "stream_options")

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    """0 with `echo`: score the prompt alone (its log-probabilities, no new token)."""
    logprobs: int | None = Field(None, ge=0, le=5)
    """The log-probability of every new token and of this many most likely tokens at its position
    (OpenAI's legacy shape: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def check(self) -> None:
        self.check_common()
        if self.max_tokens == 0 and not self.echo:
            raise bad_request("max_tokens=0 needs echo (it scores the prompt alone)", "max_tokens")
        if self.suffix:
            raise bad_request("suffix is not supported", "suffix")
        if self.best_of not in (None, 1):
            raise bad_request(f"best_of={self.best_of} is not supported yet (only 1)", "best_of")

    @property
    def top_count(self) -> int | None:
        """Most likely tokens reported at each position (None: no logprobs)."""
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        """The one prompt (text or token ids); a list of several is a batch, not supported yet."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise bad_request(f"prompt holds {len(prompt)} prompts; send one prompt per request", "prompt")
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    """Report the log-probability of every new token (`choices[i].logprobs.content`)."""
    top_logprobs: int | None = Field(None, ge=0, le=20)
    """With `logprobs`: this many most likely tokens at each position."""
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def check(self) -> None:
        self.check_common()
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if self.tools:
            raise bad_request("tools are not supported yet", "tools")
        if self.tool_choice not in (None, "none"):
            raise bad_request("tool_choice is not supported yet", "tool_choice")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise bad_request("give max_tokens or max_completion_tokens, not both", "max_tokens")

    @property
    def top_count(self) -> int | None:
        """Most likely tokens reported at each position (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, str]]:
        """The messages as a chat template reads them (`developer` is OpenAI's new name for `system`)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def _param(loc: tuple[int | str, ...]) -> str | None:
    """The field path of a validation error's location, without pydantic's union tags:
    ('messages', 0, 'content', 'str') → 'messages.0.content'."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in _TYPE_TAGS or part[:1].isupper()):
            break
        parts.append(str(part))
    return ".".join(parts) or None


def parse_body(cls: type[_Strict], body: bytes) -> Any:
    """The request `cls` read from a JSON body, or an `ApiError` 400 that names the field at fault."""
    try:
        return cls.model_validate_json(body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise bad_request(f"the body is not valid JSON: {first['msg'].removeprefix('Invalid JSON: ')}",
                              code="invalid_json") from None
        param = _param(tuple(first["loc"]))
        if first["type"] == "extra_forbidden":
            raise bad_request(f"unrecognized request argument supplied: {param}", param,
                              "unknown_parameter") from None
        if param is None:
            raise bad_request(f"the body must be a JSON object: {first['msg']}") from None
        if first["type"] == "missing":
            raise bad_request(f"missing required parameter: '{param}'", param, "missing_required_parameter") from None
        raise bad_request(f"invalid value for '{param}': {first['msg']}", param, "invalid_value") from None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}
