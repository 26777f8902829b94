"""Wire models of ``POST /v1/sessions/{id}/exec`` and ``/files`` (API.md "Sessions")."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from .scalars import Bool, NumberOnly

__all__ = ["ExecRequest", "ExecResponse", "FileWritten", "MAX_ARGV_BYTES", "MAX_ENV_BYTES"]

MAX_ARGV_BYTES = 128 * 1024  # the whole command line (Linux allows a few MiB; agents need less)
MAX_ENV_BYTES = 64 * 1024
MAX_ENV_ENTRIES = 128


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("a NUL character cannot be passed to a program")
    return value


# Documented as `not: {pattern: NUL}` rather than `pattern: ^[^\x00]*$`: the same strings,
# but generators (tests/fuzz/) make long strings for it fifty times faster.
_NO_NUL = (AfterValidator(_no_nul), Field(json_schema_extra={"not": {"pattern": "\\x00"}}))
Arg = Annotated[str, Field(max_length=MAX_ARGV_BYTES), *_NO_NUL]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")]
EnvValue = Annotated[str, Field(max_length=MAX_ENV_BYTES), *_NO_NUL]


class ExecRequest(BaseModel):
    """A command to run inside the session's sandbox: an argv list, never a shell string."""

    model_config = ConfigDict(extra="forbid")

    cmd: Annotated[list[Arg], Field(min_length=1, max_length=4096)]
    timeout_s: Annotated[float, Field(gt=0), NumberOnly] = 30.0
    env: Annotated[dict[EnvName, EnvValue], Field(max_length=MAX_ENV_ENTRIES)] = {}
    background: Bool = False
    # Secrets of the API key given to this command alone, as environment variables of
    # their names (API.md "Secrets").
    secrets: Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]],
                       Field(max_length=32)] = []

    @field_validator("cmd")
    @classmethod
    def _program(cls, cmd: list[str]) -> list[str]:
        if not cmd[0]:
            raise ValueError("cmd[0], the program to run, may not be empty")
        return cmd

    @model_validator(mode="after")
    def _secrets_apart(self) -> ExecRequest:
        both = set(self.secrets) & set(self.env)
        if both:
            raise ValueError(f"{sorted(both)[0]} is given in env and in secrets")
        if len(set(self.secrets)) != len(self.secrets):
            raise ValueError("a secret is named twice in secrets")
        return self

    @model_validator(mode="after")
    def _sizes(self) -> ExecRequest:
        if sum(len(arg.encode()) + 1 for arg in self.cmd) > MAX_ARGV_BYTES:
            raise ValueError(f"cmd is longer than {MAX_ARGV_BYTES} bytes in all")
        env_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in self.env.items())
        if env_bytes > MAX_ENV_BYTES:
            raise ValueError(f"env is larger than {MAX_ENV_BYTES} bytes in all")
        return self


class ExecResponse(BaseModel):
    """How the command ended (see ``deskbox_server.sandbox_io.ExecResult``).

    ``exit_code`` is None when the command timed out (``timed_out``: it was killed with its
    process tree; the output so far is kept) or runs in the background (``pid``: its pid in
    the sandbox). Output is decoded as UTF-8 (invalid bytes replaced) and capped; a capped
    stream is flagged ``*_truncated``.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    pid: int | None = None
    duration_ms: int


class FileWritten(BaseModel):
    path: str
    size: int
