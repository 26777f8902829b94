"""Bearer API keys: configured, or generated once into the state directory.

A session belongs to the key that created it; it is known by the key's id (a hash), never
by the key itself, so the registry holds no secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection

from ..errors import InvalidSetting, Unauthorized
from ..settings import Settings

__all__ = ["KeyRing", "Principal", "authenticate", "key_id", "load_keyring"]

log = logging.getLogger("deskbox.auth")


@dataclass(frozen=True)
class Principal:
    key_id: str


def key_id(key: str) -> str:
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:16]


class KeyRing:
    def __init__(self, keys: Sequence[str], generated_path: Path | None = None) -> None:
        if not keys:
            raise ValueError("at least one API key is needed")
        self._keys = [key.encode() for key in keys]
        self.generated_path = generated_path

    def identify(self, token: str) -> Principal | None:
        candidate = token.encode()
        found: bytes | None = None
        for key in self._keys:  # compare with every key: no early exit on a match
            if hmac.compare_digest(candidate, key):
                found = key
        return Principal(key_id(found.decode())) if found is not None else None


def load_keyring(settings: Settings) -> KeyRing:
    """Keys from settings; else the key file of the state dir, created (0600) if missing."""
    if settings.api_keys:
        return KeyRing(settings.api_keys)
    path = settings.api_key_path
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written whole under a name of its own, then linked into place if no file is
        # there: a server killed (or out of disk) while writing once left an empty key
        # file, and every later start refused to run.
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.",
                                       suffix=".partial")
    except OSError as error:  # read-only, another user's, a file: one line, not a traceback
        raise InvalidSetting(f"the state dir {path.parent} cannot be used: {error.strerror} "
                             "(DESKBOX_STATE_DIR or --state-dir)") from None
    key = "dbx_" + secrets.token_urlsafe(32)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(key + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.link(partial, path)
    except FileExistsError:
        existing = path.read_text().strip()
        if existing:
            key = existing
            log.info("API key read from %s", path)
        else:  # left empty by a server killed while writing it: it gave no key out
            os.replace(partial, path)
            log.warning("generated an API key; it is stored (mode 0600) in %s", path)
    else:
        log.warning("generated an API key; it is stored (mode 0600) in %s", path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return KeyRing([key], generated_path=path)


def authenticate(keyring: KeyRing, connection: HTTPConnection) -> Principal:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <api-key>'")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("malformed Authorization header: use 'Bearer <api-key>'")
    principal = keyring.identify(token.strip())
    if principal is None:
        raise Unauthorized("invalid API key")
    return principal
