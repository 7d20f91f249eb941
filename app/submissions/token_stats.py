"""Token statistics sent with a submission (bring your own distribution): decoded, bounded, and validated at POST
by the engine's own reader (worker.probes.token_stats_read: numpy and safetensors, no torch in the API), stored
with the submission, and shown in its view by kind, size and sha256, never by its bytes.

Two ways in: a `token_stats` object beside the solution in a JSON body, or a `token_stats` file part (with
`token_stats_kind`, `token_stats_key`) in a multipart upload."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.errors import ApiError, FieldError
from worker.formats.exceptions import plain_reason

JSON_FIELD = "token_stats"
_WHITESPACE = re.compile(rb"\s+")


class TokenStatsIn(BaseModel):
    """Token statistics in a JSON body: a histogram (a count per token id) or a sample of token ids, in order."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["auto", "histogram", "sample"] = Field(
        "auto",
        description="auto: a floating array (or a safetensors tensor keyed histogram/counts) is a histogram, "
        "an integer array a sample of ids",
    )
    format: Literal["npy", "safetensors"] = Field(description="the file format of the decoded bytes")
    data_base64: str = Field(min_length=1, description="the file's bytes, standard base64 (line breaks allowed)")
    key: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="safetensors: the tensor to use (default: the file's only tensor)",
    )


class TokenStatsView(BaseModel):
    """The token statistics a submission carries, as its audits use them (the bytes are not shown)."""

    kind: Literal["histogram", "sample"] = Field(
        description="as read: a histogram is drawn i.i.d., a sample as windows"
    )
    requested_kind: Literal["auto", "histogram", "sample"]
    format: Literal["npy", "safetensors"]
    key: str | None
    entries: int = Field(description="bins of a histogram, ids of a sample")
    size_bytes: int = Field(description="of the file as sent (decoded)")
    sha256: str = Field(description="of the file as sent (decoded)")
    source: str = Field(description="how the probes' and the canary's evidence name these statistics")


@dataclass(frozen=True)
class AcceptedTokenStats:
    """Validated token statistics, ready to store."""

    data: bytes
    format: str
    requested_kind: str
    kind: str
    key: str | None
    entries: int
    sha256: str

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def source_label(fmt: str, sha256: str) -> str:
    """The name the worker gives the statistics in the evidence; the view shows the same string."""
    return f"token_stats sent with the submission ({fmt}, sha256 {sha256[:16]})"


def _invalid(errors: list[FieldError]) -> ApiError:
    return ApiError(422, "invalid token_stats", errors)


def _too_large(field: str, size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        "token_stats too large",
        [
            FieldError(
                field=field,
                reason=(
                    f"the file is {size} bytes; at most {limit} are accepted (KAUDIT_TOKEN_STATS_MAX_BYTES): send a histogram "
                    "(one count per token id) or a shorter sample of ids"
                ),
            )
        ],
    )


def validate(
    data: bytes, fmt: str, kind: str, key: str | None, fields: dict[str, str], limit: int
) -> AcceptedTokenStats:
    """Read `data` as the engine will; `fields` names the request's field for data, kind and key."""
    from worker.probes.token_stats_read import TokenStatsError, parse  # numpy: only when statistics are sent

    if len(data) > limit:
        raise _too_large(fields["data"], len(data), limit)
    try:
        parsed = parse(data, fmt, kind, key)  # type: ignore[arg-type]
    except TokenStatsError as err:
        raise _invalid([FieldError(field=fields[err.field], reason=str(err))]) from err
    return AcceptedTokenStats(
        data=data,
        format=fmt,
        requested_kind=kind,
        kind=parsed.kind,
        key=parsed.key,
        entries=parsed.entries,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def from_json(value: object, limit: int) -> AcceptedTokenStats:
    """The `token_stats` object of a JSON body; 422 naming the field at fault, 413 over `limit` decoded bytes."""
    try:
        stats = TokenStatsIn.model_validate(value)
    except ValidationError as err:
        raise _invalid(
            [
                FieldError(
                    field=".".join([JSON_FIELD, *(str(p) for p in e["loc"])]), reason=plain_reason(str(e["msg"]))
                )
                for e in err.errors()
            ]
        ) from err
    field = f"{JSON_FIELD}.data_base64"
    text = stats.data_base64.encode("ascii", errors="replace")
    if _WHITESPACE.search(text):
        text = _WHITESPACE.sub(b"", text)
    decoded_size = len(text) // 4 * 3 - len(text[-2:]) + len(text[-2:].rstrip(b"="))
    if decoded_size > limit:  # refused before decoding
        raise _too_large(field, decoded_size, limit)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise _invalid(
            [
                FieldError(
                    field=field,
                    reason=(
                        f"not valid base64 ({err}); send the file's bytes in standard base64, for example the output of "
                        "`base64 -w0 ids.npy` or Python's base64.b64encode"
                    ),
                )
            ]
        ) from err
    fields = {"data": field, "kind": f"{JSON_FIELD}.kind", "key": f"{JSON_FIELD}.key"}
    return validate(data, stats.format, stats.kind, stats.key, fields, limit)


def from_upload(filename: str, data: bytes, kind: str, key: str | None, limit: int) -> AcceptedTokenStats:
    """A multipart `token_stats` file part; the format comes from its name (.npy or .safetensors)."""
    from worker.probes.token_stats_read import KINDS, TokenStatsError, format_of

    fields = {"data": "token_stats", "kind": "token_stats_kind", "key": "token_stats_key"}
    if kind not in KINDS:
        raise _invalid(
            [FieldError(field=fields["kind"], reason=f"must be one of {', '.join(KINDS)}, not '{kind[:50]}'")]
        )
    try:
        fmt = format_of(filename)
    except TokenStatsError as err:
        raise _invalid([FieldError(field=fields["data"], reason=f"'{filename[:100]}': {err}")]) from err
    return validate(data, fmt, kind, key or None, fields, limit)


def view(
    fmt: str, requested_kind: str, kind: str, key: str | None, entries: int, size_bytes: int, sha256: str
) -> TokenStatsView:
    return TokenStatsView(
        kind=kind,
        requested_kind=requested_kind,
        format=fmt,
        key=key,
        entries=entries,  # type: ignore[arg-type]
        size_bytes=size_bytes,
        sha256=sha256,
        source=source_label(fmt, sha256),
    )


__all__ = [
    "AcceptedTokenStats",
    "TokenStatsIn",
    "TokenStatsView",
    "from_json",
    "from_upload",
    "source_label",
    "validate",
    "view",
]
