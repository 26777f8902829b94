"""Secrets of API keys: stored encrypted, used by the server, never handed back.

``<state>/secrets/<key id>/<name>.json`` (mode 0600, in 0700 directories) holds a secret's
name, allowed origins and its value encrypted with Fernet (AES-128-CBC and HMAC-SHA256, from
the ``cryptography`` package) under the server's key, ``<state>/secrets.key`` (mode 0600,
made on first use). The plain value exists only in the server's memory while it is used:
typed into a page of an allowed origin (session.py checks the focus first), or given to one
command as an environment variable.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import re
import threading
from datetime import datetime
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from pydantic import BaseModel, ValidationError

from ..errors import Conflict, Internal, NotFound, QuotaExceeded
from ..sandbox_io import ExecResult
from ..schemas.secrets import SecretCreate
from .atomic_file import replace_file
from .lifecycle import utcnow

__all__ = ["SecretRecord", "SecretStore", "redact"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")  # schemas.secrets.SecretName
_OWNER = re.compile(r"^key_[0-9a-f]{16}$")
_MAX_PER_KEY = 256
# Shorter values are not blanked from output: every such character string would go too.
_REDACT_MIN = 4


class SecretRecord(BaseModel):
    name: str
    owner: str
    allowed_origins: list[str]
    created_at: datetime
    ciphertext: str  # Fernet token of the value

    def __repr__(self) -> str:  # never the ciphertext either, in a log or a traceback
        return f"SecretRecord(name={self.name!r}, owner={self.owner!r})"


class SecretStore:
    def __init__(self, root: Path, key_path: Path) -> None:
        self.root = root
        self._key_path = key_path
        self._fernet: Fernet | None = None
        self._creating = threading.Lock()

    def open(self) -> None:
        """The root (mode 0700) and the server's key (mode 0600; made if missing)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        try:
            key = self._key_path.read_bytes().strip()
        except FileNotFoundError:
            key = Fernet.generate_key()
            replace_file(self._key_path, key + b"\n")
        os.chmod(self._key_path, 0o600)
        try:
            self._fernet = Fernet(key)
        except ValueError:
            raise Internal(f"{self._key_path} is not a secrets key (Fernet, base64)") from None

    @property
    def fernet(self) -> Fernet:
        assert self._fernet is not None, "the secret store is not open"
        return self._fernet

    def _path(self, owner: str, name: str) -> Path:
        assert _OWNER.match(owner) and _NAME.match(name), name
        return self.root / owner / f"{name}.json"

    def _read(self, owner: str, name: str) -> SecretRecord | None:
        if not _NAME.match(name):
            return None
        try:
            return SecretRecord.model_validate_json(self._path(owner, name).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError):
            raise Internal(f"the secret {name!r} is unreadable on this server") from None

    def get(self, owner: str, name: str) -> SecretRecord:
        record = self._read(owner, name)
        if record is None:
            raise NotFound(f"no secret {name!r}")
        return record

    def list(self, owner: str) -> builtins.list[SecretRecord]:
        directory = self.root / owner
        if not directory.is_dir():
            return []
        names = sorted(p.stem for p in directory.glob("*.json"))
        return [r for r in (self._read(owner, n) for n in names) if r is not None]

    def create(self, owner: str, body: SecretCreate) -> SecretRecord:
        # One at a time (creates run on threads): two of one name both found none and both
        # answered 201, the second replacing the first; two at the cap both passed it.
        with self._creating:
            return self._create(owner, body)

    def _create(self, owner: str, body: SecretCreate) -> SecretRecord:
        if self._read(owner, body.name) is not None:
            raise Conflict(f"a secret {body.name!r} exists already; delete it to replace it")
        if len(self.list(owner)) >= _MAX_PER_KEY:
            raise QuotaExceeded(f"this API key has {_MAX_PER_KEY} secrets; delete some first")
        record = SecretRecord(
            name=body.name, owner=owner, allowed_origins=body.allowed_origins,
            created_at=utcnow(),
            ciphertext=self.fernet.encrypt(body.value.encode()).decode(),
        )
        directory = self.root / owner
        directory.mkdir(mode=0o700, exist_ok=True)
        replace_file(self._path(owner, body.name), record.model_dump_json().encode())
        return record

    def delete(self, owner: str, name: str) -> None:
        self.get(owner, name)
        self._path(owner, name).unlink(missing_ok=True)

    def value(self, record: SecretRecord) -> str:
        """The plain value, for the server's own use only."""
        try:
            return self.fernet.decrypt(record.ciphertext.encode()).decode()
        except InvalidToken:
            raise Internal(f"the secret {record.name!r} was stored under another server "
                           "key and cannot be read") from None


def redact(result: ExecResult, values: dict[str, str]) -> ExecResult:
    """A command's output with each secret's value (4 characters or more) replaced by
    ``[secret NAME]``: a command that prints a secret does not hand it back through the
    API (one that encodes it first does; the README says so). Output cut at its limit may
    end with the start of a value: that start is replaced too."""
    stdout = _redacted(result.stdout, values, result.stdout_truncated)
    stderr = _redacted(result.stderr, values, result.stderr_truncated)
    return dataclasses.replace(result, stdout=stdout, stderr=stderr)


def _redacted(output: bytes, values: dict[str, str], truncated: bool) -> bytes:
    for name, value in values.items():
        if len(value) < _REDACT_MIN:
            continue
        plain, mark = value.encode(), f"[secret {name}]".encode()
        output = output.replace(plain, mark)
        if truncated:
            cut = next((k for k in range(len(plain) - 1, 0, -1)
                        if output.endswith(plain[:k])), 0)
            if cut:
                output = output[:-cut] + mark
    return output
