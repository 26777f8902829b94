"""Session-scoped tokens (API.md): URLs a browser or Playwright opens carry one of these.

A token grants one scope (``view``, ``control`` or ``cdp``) on one session, for a limited
time, until it is revoked. Only a SHA-256 of each token is kept (the token itself is shown
once, when it is issued); looking one up hashes what was presented, so neither the store
nor a log line ever holds a usable token. The store lives in memory: a restarted server
has forgotten every token, which is the safe direction.

The one call other modules need::

    grant = tokens.verify(token, session_id, "control")   # or ("view", "control")
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

from ..errors import Capacity, Forbidden, NotFound, Unauthorized

__all__ = ["SCOPES", "Scope", "SessionToken", "TokenStore", "looks_like_token"]

Scope = Literal["view", "control", "cdp"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
PREFIX = "dbt_"
_MAX_PER_SESSION = 256
_MAX_TOKENS = 100_000


@dataclass(frozen=True)
class SessionToken:
    """What is known of an issued token (never the token itself)."""

    id: str
    session_id: str
    owner: str  # the id of the API key that issued it
    scope: Scope
    expires_at: float  # time.time()

    @property
    def expires_at_utc(self) -> datetime:
        return datetime.fromtimestamp(self.expires_at, UTC)


def looks_like_token(value: str) -> bool:
    """Whether ``value`` has the shape of a session token (not of an API key)."""
    return value.startswith(PREFIX)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


class TokenStore:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._by_digest: dict[str, SessionToken] = {}
        self._digest_by_id: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def issue(
        self, owner: str, session_id: str, scope: Scope, ttl_s: float
    ) -> tuple[str, SessionToken]:
        """A new token (shown once) and its record. The caller checked ``owner`` owns it."""
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}")
        self._prune()
        if sum(1 for t in self._by_digest.values() if t.session_id == session_id) >= (
            _MAX_PER_SESSION
        ):
            raise Capacity(
                f"session {session_id} has {_MAX_PER_SESSION} live tokens; revoke some first"
            )
        if len(self._by_digest) >= _MAX_TOKENS:
            raise Capacity("the server holds too many live tokens; try again later")
        token = PREFIX + secrets.token_urlsafe(32)
        record = SessionToken(
            id="tok_" + secrets.token_hex(8),
            session_id=session_id,
            owner=owner,
            scope=scope,
            expires_at=self._clock() + ttl_s,
        )
        digest = _digest(token)
        self._by_digest[digest] = record
        self._digest_by_id[record.id] = digest
        return token, record

    def revoke(self, owner: str, session_id: str, token_id: str) -> None:
        """Forget the token at once; NotFound unless ``owner`` issued it for ``session_id``."""
        digest = self._digest_by_id.get(token_id)
        record = self._by_digest.get(digest) if digest is not None else None
        if record is None or record.owner != owner or record.session_id != session_id:
            raise NotFound(f"no token {token_id!r} for session {session_id}")
        self._drop(record.id)

    def forget_session(self, session_id: str) -> None:
        """Drop every token of a session (it has ended)."""
        for record in [t for t in self._by_digest.values() if t.session_id == session_id]:
            self._drop(record.id)

    def verify(
        self, token: str, session_id: str, scope: Scope | Collection[Scope]
    ) -> SessionToken:
        """The token's record if it is live, for ``session_id`` and one of ``scope``.

        Unauthorized for unknown, revoked and expired tokens; Forbidden for a token of
        another session or scope. Messages never repeat the token.
        """
        scopes: Collection[str] = (scope,) if isinstance(scope, str) else scope
        record = self._by_digest.get(_digest(token)) if looks_like_token(token) else None
        if record is None:
            raise Unauthorized("invalid session token (unknown, revoked or expired)")
        if record.expires_at <= self._clock():
            self._drop(record.id)
            raise Unauthorized("invalid session token (unknown, revoked or expired)")
        if record.session_id != session_id:
            raise Forbidden("this token belongs to another session")
        if record.scope not in scopes:
            wanted = " or ".join(repr(s) for s in scopes)
            raise Forbidden(f"this token's scope is {record.scope!r}; this needs {wanted}")
        return record

    def _drop(self, token_id: str) -> None:
        digest = self._digest_by_id.pop(token_id, None)
        if digest is not None:
            self._by_digest.pop(digest, None)

    def _prune(self) -> None:
        now = self._clock()
        for record in [t for t in self._by_digest.values() if t.expires_at <= now]:
            self._drop(record.id)
