"""The one owner of App JWTs and installation tokens.

* ``app_jwt()``: RS256, ``iat`` 60 s in the past, ``exp`` 9 minutes ahead (10 minutes after
  ``iat``, GitHub's ceiling), reckoned on ``jwt_clock`` (the system clock unless injected); reused
  until two minutes before it expires.
* ``installation_token(id)``: reckoned on ``clock`` (inject the forge's clock in tests); cached
  per installation and refreshed ``margin + skew`` seconds before ``expires_at``; an
  ``asyncio.Lock`` per installation makes concurrent callers share one refresh.
* ``invalidate(id)``: drop a token the forge answered 401 to; the next call fetches a new one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from gidgethub import GitHubBroken, HTTPException
from gidgethub.aiohttp import GitHubAPI

from .clock import Clock, SystemClock
from .errors import ForgeError, NotFound, TransientError, Unauthorized

log = logging.getLogger("vaultmail.forge.tokens")

JWT_BACKDATE = 60.0  # iat this far in the past, for clock drift
JWT_LIFETIME = 600.0  # exp - iat; GitHub refuses more than 10 minutes
JWT_REUSE_MARGIN = 120.0  # make a new JWT when the cached one has less than this left
TOKEN_LIFETIME_FALLBACK = 3600.0  # if a token response has no expires_at


@functools.lru_cache(maxsize=8)
def signing_key(private_key_pem: str) -> RSAPrivateKey:
    """The App's key, read once a process: reading a PEM checks the RSA key's consistency,
    which costs more (about 50 ms) than the JWT it signs."""
    key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
    if not isinstance(key, RSAPrivateKey):
        raise ValueError("the App's private key is not an RSA key: a GitHub App signs its "
                         "JWTs with RS256 (use the .pem file from the App's settings page)")
    return key


@dataclass
class _Token:
    token: str
    expires_at: float  # epoch seconds, the forge's word
    refresh_at: float  # when to fetch a new one (before expires_at by margin + skew)


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class AppJwtAPI(GitHubAPI):
    """gidgethub's client for the App's own calls (its JWT), redirects not followed: the JWT
    goes to the forge alone, and an answer (a token, the installations) is taken from the
    forge alone (GitHub never redirects these; the redirect is the answer, which gidgethub
    raises)."""

    async def _request(self, method: str, url: str, headers: Mapping[str, str],
                       body: bytes = b"") -> tuple[int, Mapping[str, str], bytes]:
        async with self._session.request(method, url, headers=headers, data=body,
                                         allow_redirects=False) as response:
            return response.status, response.headers, await response.read()


class AppAuth:
    """App JWTs and installation tokens for one GitHub App."""

    def __init__(
        self,
        app_id: str | int,
        private_key_pem: str,
        api_url: str,
        session: aiohttp.ClientSession,
        clock: Clock | None = None,
        *,
        jwt_clock: Clock | None = None,
        requester: str = "vaultmail",
        margin: float = 300.0,
        skew: float = 60.0,
        timeout: float = 30.0,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> None:
        self.app_id = str(app_id)
        self._key = private_key_pem
        self.api_url = api_url.rstrip("/")
        self.session = session
        self.clock: Clock = clock if clock is not None else SystemClock()
        # JWTs are checked against the forge's wall clock (the local forge does not move JWT time
        # with forge.clock.advance), so they have their own clock, the system clock by default.
        self.jwt_clock: Clock = jwt_clock if jwt_clock is not None else SystemClock()
        self.requester = requester
        self.margin = margin
        self.skew = skew
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self._jwt: str | None = None
        self._jwt_exp = 0.0
        self._tokens: dict[int, _Token] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self.token_requests = 0  # POST .../access_tokens made (for tests and benchmarks)

    # -- JWT -------------------------------------------------------------------------------------

    def app_jwt(self) -> str:
        """A JWT authenticating as the App (``Authorization: Bearer``)."""
        now = self.jwt_clock.now()
        if self._jwt is None or now >= self._jwt_exp - JWT_REUSE_MARGIN:
            iat = int(now - JWT_BACKDATE)
            exp = iat + int(JWT_LIFETIME)
            self._jwt = jwt.encode(
                {"iat": iat, "exp": exp, "iss": self.app_id}, signing_key(self._key),
                algorithm="RS256",
            )
            self._jwt_exp = float(exp)
        return self._jwt

    def invalidate_jwt(self) -> None:
        self._jwt = None

    # -- installation tokens ---------------------------------------------------------------------

    def _fresh(self, tok: _Token | None) -> bool:
        return tok is not None and self.clock.now() < tok.refresh_at

    def cached_token(self, installation_id: int) -> str | None:
        tok = self._tokens.get(int(installation_id))
        return tok.token if tok is not None and self._fresh(tok) else None

    async def installation_token(self, installation_id: int) -> str:
        """A valid installation token; one refresh at a time per installation."""
        iid = int(installation_id)
        tok = self._tokens.get(iid)
        if tok is not None and self._fresh(tok):
            return tok.token
        lock = self._locks.setdefault(iid, asyncio.Lock())
        async with lock:
            tok = self._tokens.get(iid)
            if tok is not None and self._fresh(tok):
                return tok.token  # another caller refreshed it while we waited
            tok = await self._request_token(iid)
            self._tokens[iid] = tok
            return tok.token

    def invalidate(self, installation_id: int, token: str | None = None) -> None:
        """Forget the cached token (after a 401). With ``token``, only if it is still that one,
        so a burst of 401s on one stale token causes one refresh, not many."""
        iid = int(installation_id)
        cur = self._tokens.get(iid)
        if cur is not None and (token is None or cur.token == token):
            del self._tokens[iid]
            log.info("installation token invalidated", extra={"installation_id": iid})

    async def _request_token(self, iid: int) -> _Token:
        gh = AppJwtAPI(self.session, self.requester, base_url=self.api_url)
        url = f"/app/installations/{iid}/access_tokens"
        full = f"{self.api_url}{url}"
        renewed_jwt = False
        attempt = 0
        while True:
            attempt += 1
            self.token_requests += 1
            try:
                async with asyncio.timeout(self.timeout):
                    data = await gh.post(url, data=b"", jwt=self.app_jwt())
            except HTTPException as exc:
                status = int(exc.status_code)
                if status == 401 and not renewed_jwt:
                    renewed_jwt = True
                    self.invalidate_jwt()
                    continue
                if isinstance(exc, GitHubBroken) and attempt < self.attempts:
                    await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
                    continue
                kind: type[ForgeError] = ForgeError
                if status == 404:
                    kind = NotFound
                elif status == 401:
                    kind = Unauthorized
                elif status >= 500:
                    kind = TransientError
                raise kind(
                    f"installation token for {iid} refused: {exc}",
                    status=status,
                    method="POST",
                    url=full,
                    headers=exc.headers,
                ) from exc
            except (TimeoutError, aiohttp.ClientError) as exc:
                if attempt < self.attempts:
                    await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
                    continue
                raise TransientError(
                    f"installation token for {iid}: {exc!r}", method="POST", url=full
                ) from exc
            if not isinstance(data, dict) or not isinstance(data.get("token"), str):
                raise ForgeError(
                    "installation token response has no token", method="POST", url=full
                )
            now = self.clock.now()
            expires = _parse_time(data.get("expires_at"))
            if expires is None:
                expires = now + TOKEN_LIFETIME_FALLBACK
            # refresh margin + skew early, but never sooner than half the token's lifetime
            early = min(self.margin + self.skew, max(0.0, (expires - now) / 2))
            log.info(
                "installation token issued",
                extra={"installation_id": iid, "expires_at": data.get("expires_at")},
            )
            return _Token(token=data["token"], expires_at=expires, refresh_at=expires - early)


__all__ = ["AppAuth", "AppJwtAPI"]
