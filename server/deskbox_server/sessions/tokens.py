"""Session-scoped tokens (API.md): URLs a browser or Playwright opens carry one of these.

A token grants one scope (``view``, ``control`` or ``cdp``) on one session, for a limited
time, until it is revoked. Only a SHA-256 of each token is kept (the token itself is shown
once, when it is issued); looking one up hashes what was presented, so neither the store
nor a log line ever holds a usable token. The store lives in memory: a restarted server
has forgotten every token, which is the safe direction. In a fleet of servers
(``DESKBOX_REGISTRY=cluster``) each digest is also kept with its session's shared record,
so a token issued through one server opens the session through any other, and a revoke
through any of them closes it everywhere.

The one call other modules need::

    grant = await tokens.verify(token, session_id, "control")   # or ("view", "control")
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

from ..engines.base import SharedRecords
from ..errors import Capacity, Forbidden, NotFound, Unauthorized

__all__ = ["SCOPES", "Scope", "SessionToken", "TokenStore", "looks_like_token"]

Scope = Literal["view", "control", "cdp"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
PREFIX = "dbt_"
_MAX_PER_SESSION = 256
_MAX_TOKENS = 100_000
# An ended session's tokens answer 404 (the session ended) rather than 401 for this long:
# a live view polls its status once its picture closes and must say "ended", not "access
# refused"; a person reloading the page minutes later is told the same. Bounded, apart from
# the live tokens' bound (a key churning sessions must not fill either).
_ENDED_KEPT_S = 600.0
_MAX_ENDED = 10_000


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


@dataclass(frozen=True)
class _Ended:
    """A token of a session that ended, kept to say so (never to open anything)."""

    token: SessionToken
    state: str  # how the session ended: stopped or failed
    until: float  # time.time(): the token's expiry, or sooner


def looks_like_token(value: str) -> bool:
    """Whether ``value`` has the shape of a session token (not of an API key)."""
    return value.startswith(PREFIX)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


def _shared_token(text: str) -> SessionToken | None:
    try:
        fields = json.loads(text)
        token = SessionToken(**fields)
    except (ValueError, TypeError):
        return None
    return token if token.scope in SCOPES else None


class TokenStore:
    """``shared``: where a fleet of servers keeps its sessions' records (the tokens' digests
    go with them); None: this server's memory only."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 shared: SharedRecords | None = None) -> None:
        self._clock = clock
        self._shared = shared
        self._by_digest: dict[str, SessionToken] = {}
        self._digest_by_id: dict[str, str] = {}
        self._ended: dict[str, _Ended] = {}  # by digest, oldest first

    def __len__(self) -> int:
        """The live tokens (what the server's bound counts; not the ended sessions')."""
        return len(self._by_digest)

    @property
    def shared(self) -> bool:
        """Whether looking a token up asks the fleet's records (a call to the cluster)."""
        return self._shared is not None

    async def issue(
        self, owner: str, session_id: str, scope: Scope, ttl_s: float
    ) -> tuple[str, SessionToken]:
        """A new token (shown once) and its record. The caller checked ``owner`` owns it."""
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}")
        self._prune()
        expired: list[str] = []
        if self._shared is None:
            live = sum(1 for t in self._by_digest.values() if t.session_id == session_id)
        else:
            live, expired = await self._shared_count(session_id)
        if live >= _MAX_PER_SESSION:
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
        if self._shared is not None and not await self._shared.add_token(
                session_id, digest, json.dumps(dataclasses.asdict(record)), expired):
            raise NotFound(f"no session {session_id!r}")
        self._by_digest[digest] = record
        self._digest_by_id[record.id] = digest
        return token, record

    async def _shared_count(self, session_id: str) -> tuple[int, list[str]]:
        """The session's live tokens in the fleet's record, and the digests of its expired
        ones. The fleet's, not this server's: another replica issues and revokes them
        too, and the record (one Secret, at most 1 MiB) keeps them all until they are
        dropped, which the next issue does with the expired ones."""
        assert self._shared is not None
        entry = await self._shared.read(session_id)
        if entry is None:
            raise NotFound(f"no session {session_id!r}")
        now, live, expired = self._clock(), 0, []
        for digest, text in entry.tokens.items():
            token = _shared_token(text)
            if token is not None and token.expires_at <= now:
                expired.append(digest)
            elif token is not None:
                live += 1
        return live, expired

    async def revoke(self, owner: str, session_id: str, token_id: str) -> None:
        """Forget the token at once; NotFound unless ``owner`` issued it for ``session_id``."""
        digest = self._digest_by_id.get(token_id)
        record = self._by_digest.get(digest) if digest is not None else None
        if record is None and self._shared is not None:
            digest, record = await self._shared_by_id(session_id, token_id)
        if (digest is None or record is None or record.owner != owner
                or record.session_id != session_id):
            raise NotFound(f"no token {token_id!r} for session {session_id}")
        if self._shared is not None:
            await self._shared.drop_token(session_id, digest)
        self._drop(record.id)

    async def _shared_by_id(self, session_id: str, token_id: str
                            ) -> tuple[str | None, SessionToken | None]:
        assert self._shared is not None
        entry = await self._shared.read(session_id)
        for digest, text in (entry.tokens.items() if entry is not None else ()):
            token = _shared_token(text)
            if token is not None and token.id == token_id:
                return digest, token
        return None, None

    async def _shared_lookup(self, digest: str, session_id: str) -> SessionToken | None:
        """The token of ``digest`` as the fleet keeps it with ``session_id``'s record: the
        truth, whoever issued or revoked it."""
        assert self._shared is not None
        entry = await self._shared.read(session_id)
        text = entry.tokens.get(digest) if entry is not None else None
        found = _shared_token(text) if text is not None else None
        if found is None:  # revoked through another server, or never this session's
            if (mine := self._by_digest.get(digest)) is not None and (
                    mine.session_id == session_id):
                self._drop(mine.id)
            return self._by_digest.get(digest)  # another session's: Forbidden below
        return found

    async def verify(
        self, token: str, session_id: str, scope: Scope | Collection[Scope]
    ) -> SessionToken:
        """The token's record if it is live, for ``session_id`` and one of ``scope``.

        Unauthorized for unknown, revoked and expired tokens; Forbidden for a token of
        another session or scope; NotFound for a token of a session that ended not long
        ago (in a fleet such a token still verifies: the records keep it, and the session's
        state says that it ended). Messages never repeat the token.
        """
        scopes: Collection[str] = (scope,) if isinstance(scope, str) else scope
        record: SessionToken | None = None
        ended: _Ended | None = None
        if looks_like_token(token):
            digest = _digest(token)
            record = (self._by_digest.get(digest) if self._shared is None
                      else await self._shared_lookup(digest, session_id))
            if record is None and (ended := self._ended.get(digest)) is not None:
                if ended.until <= self._clock():
                    del self._ended[digest]
                else:
                    record = ended.token
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
        if ended is not None:
            raise NotFound(f"session {session_id} ended ({ended.state})")
        return record

    def forget_session(self, session_id: str, state: str) -> None:
        """The session ended (``state``: stopped or failed): its tokens can open nothing
        any more, and no longer count against the server's bound (one key churning
        sessions with week-long tokens once filled it for every key). For a while they
        still say that the session ended."""
        now = self._clock()
        for record in [t for t in self._by_digest.values() if t.session_id == session_id]:
            digest = self._digest_by_id[record.id]
            self._drop(record.id)
            if self._shared is None:  # a fleet's records keep them, with the session's end
                self._ended[digest] = _Ended(
                    record, state, min(record.expires_at, now + _ENDED_KEPT_S))
        for digest in [d for d, e in self._ended.items() if e.until <= now]:
            del self._ended[digest]
        while len(self._ended) > _MAX_ENDED:
            del self._ended[next(iter(self._ended))]

    def _drop(self, token_id: str) -> None:
        digest = self._digest_by_id.pop(token_id, None)
        if digest is not None:
            self._by_digest.pop(digest, None)

    def _prune(self) -> None:
        now = self._clock()
        for record in [t for t in self._by_digest.values() if t.expires_at <= now]:
            self._drop(record.id)
