"""The strict decoder of request log lines: msgspec's typed decoding, whose first error is the
reason a line is skipped ("prompt_token_ids must be a non-empty list of token ids (expected
`int` >= 0 at prompt_token_ids[1])").

Every line simdjson's pass (``core/logs/jsonline.py``) does not take comes here, so what is
accepted and every reason given are this module's; it is imported only then (msgspec's
import is a few percent of a short audit).
"""

from __future__ import annotations

from array import array
from typing import Annotated, Any

import msgspec

from prefixwatch.core.logs.jsonline import OTHER_FIELDS
from prefixwatch.core.logs.request import LogRequest
from prefixwatch.core.logs.tokenids import packed_ids

#: A token id as a log may carry it: a JSON integer >= 0 (msgspec's ``int`` refuses booleans
#: and floats such as 1.0).
TokenId = Annotated[int, msgspec.Meta(ge=0)]
_Count = Annotated[int, msgspec.Meta(ge=0)]
_Ids = list[TokenId]  # type: ignore[valid-type]

#: The fields of a JSONL request line, typed so that msgspec checks them while it decodes
#: (one pass in C, no Python work per token); unknown fields are skipped. The last six are
#: the ones simdjson's pass hands over for checking (``OTHER_FIELDS``).
_FIELDS: list[tuple[str, Any, Any]] = [
    ("prompt_token_ids", _Ids | msgspec.UnsetType, msgspec.UNSET),
    ("messages", Any, msgspec.UNSET),
    ("tools", Any, None),
    ("prompt", str | _Ids | msgspec.UnsetType, msgspec.UNSET),
    ("lora", str | None, None),
    ("cache_salt", str | None, None),
    ("replica", str | None, None),
    ("cached_tokens", _Count | None, None),
    ("usage", Any, None),
    ("max_tokens", _Count | None, None),
]
FIELD_NAMES = frozenset(name for name, _, _ in _FIELDS)
_RequestLine = msgspec.defstruct("_RequestLine", _FIELDS, gc=False)
_OtherFields = msgspec.defstruct(
    "_OtherFields", [f for f in _FIELDS if f[0] in OTHER_FIELDS], gc=False)

_decode_line = msgspec.json.Decoder(_RequestLine).decode
_decode_ids = msgspec.json.Decoder(_Ids).decode

_IDS_REASON = "prompt_token_ids must be a non-empty list of token ids"
_FIELD_REASONS = {
    "prompt_token_ids": _IDS_REASON,
    "prompt": "prompt must be a non-empty string or a non-empty list of token ids",
    "lora": "lora must be a string",
    "cache_salt": "cache_salt must be a string",
    "replica": "replica must be a string",
    "cached_tokens": "cached_tokens must be a non-negative integer",
    "max_tokens": "max_tokens must be a non-negative integer",
}
_TOO_DEEP = "not JSON (nested too deeply)"


def _invalid(exc: msgspec.ValidationError) -> ValueError:
    """msgspec's "Expected `int`, got `bool` - at `$.prompt_token_ids[3]`" as the reason a
    line is skipped: the field's rule, then what msgspec found and where."""
    detail, _, path = str(exc).partition(" - at `")
    path = path.rstrip("`")
    if not path:
        return ValueError("not a JSON object")
    field = path[2:].split("[", 1)[0].split(".", 1)[0]
    rule = _FIELD_REASONS.get(field, f"{field} is not valid")
    return ValueError(f"{rule} ({detail.lower()} at {path[2:]})")


def parse_request(obj: Any, where: str) -> LogRequest:
    """A request object in any of the accepted forms; ValueError with a reason otherwise."""
    try:
        line = msgspec.convert(obj, _RequestLine)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    return _request(line, where)


def decode_request(text: str | bytes, where: str) -> LogRequest:
    """One JSON line, decoded and checked in one pass; ValueError with a reason otherwise."""
    try:
        line = _decode_line(text)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    except msgspec.DecodeError as exc:
        if isinstance(text, bytes):  # not UTF-8: read it as the text decoder would
            return decode_request(text.decode("utf-8", errors="replace"), where)
        raise ValueError(f"not JSON ({exc})") from None
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    return _request(line, where)


def other_fields(values: dict[str, Any]) -> Any | None:
    """The fields of ``OTHER_FIELDS`` simdjson's pass found, checked by the same types (an
    object with their attributes); None when one is not valid (the line is decoded again
    here, for the reason)."""
    try:
        return msgspec.convert(values, _OtherFields)
    except msgspec.ValidationError:
        return None


def listed_ids(text: str) -> array | None:
    """A vLLM log line's ``[1, 2, 3]`` (JSON), strictly: the ids, None for an empty list,
    or ValueError saying what is wrong."""
    try:
        ids = _decode_ids(text)
    except msgspec.ValidationError as exc:
        if ">= 0" in str(exc):
            raise ValueError("negative token id") from None
        raise ValueError("prompt_token_ids holds something other than token ids") from None
    except (msgspec.DecodeError, RecursionError):
        raise ValueError("prompt_token_ids holds something other than token ids") from None
    return packed_ids(ids) if ids else None


def _request(line: Any, where: str) -> LogRequest:
    found = _parse_prompt(line, where)
    found.replica, found.max_tokens = line.replica, line.max_tokens
    found.cached_tokens = cached_tokens(line)
    return found


def cached_tokens(line: Any) -> int | None:
    """``cached_tokens`` at the top, or in an OpenAI ``usage`` object; None when absent."""
    if line.cached_tokens is not None:
        return line.cached_tokens
    usage = line.usage
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("cached_tokens must be a non-negative integer")
    return value


def _parse_prompt(line: Any, where: str) -> LogRequest:
    lora, salt = line.lora, line.cache_salt
    if line.prompt_token_ids is not msgspec.UNSET:
        if not line.prompt_token_ids:
            raise ValueError(_IDS_REASON)
        return LogRequest(where, token_ids=packed_ids(line.prompt_token_ids), lora=lora,
                          cache_salt=salt)
    if line.messages is not msgspec.UNSET:
        messages = line.messages
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages must be a non-empty list of {role, content} objects")
        tools = line.tools
        if tools is not None and not isinstance(tools, list):
            raise ValueError("tools must be a list")
        return LogRequest(where, messages=messages, tools=tools, lora=lora, cache_salt=salt)
    prompt = line.prompt
    if prompt is not msgspec.UNSET:
        if not prompt:
            raise ValueError(_FIELD_REASONS["prompt"])
        if isinstance(prompt, list):
            return LogRequest(where, token_ids=packed_ids(prompt), lora=lora, cache_salt=salt)
        return LogRequest(where, prompt=prompt, lora=lora, cache_salt=salt)
    raise ValueError("no messages, prompt or prompt_token_ids")
