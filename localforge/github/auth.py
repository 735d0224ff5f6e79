"""Credentials as GitHub reads them: PATs, user access tokens (`ghu_`, a user through an App),
installation tokens and App JWTs (RS256)."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

from ..access import Principal
from .http import ApiError

if TYPE_CHECKING:
    from ..forge import LocalForge

MAX_JWT_LIFETIME = 600  # exp at most 10 minutes ahead
SKEW = 60  # clock drift tolerated on iat
EXP_SLACK = 30  # request latency tolerated on exp


def bad_credentials() -> ApiError:
    return ApiError(401, "Bad credentials")


@functools.lru_cache(maxsize=64)
def _public_key(pem: str) -> RSAPublicKey | None:
    """An App's public key, read once (PyJWT reads a PEM given as text at every check); None
    where it is no RSA key (no RS256 JWT verifies)."""
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except ValueError:
        return None
    return key if isinstance(key, RSAPublicKey) else None


def _looks_like_jwt(value: str) -> bool:
    return value.count(".") == 2 and value.startswith("eyJ")


def verify_jwt(forge: LocalForge, token: str) -> Principal:
    """Verify an App JWT against the wall clock (the app mints them with time.time())."""
    try:
        claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise ApiError(401, "A JSON web token could not be decoded") from exc
    if header.get("alg") != "RS256":
        raise ApiError(401, "A JSON web token could not be decoded")
    iss = claims.get("iss")
    app = None
    for candidate in forge.state.apps.values():
        if str(iss) in (str(candidate.id), candidate.client_id):
            app = candidate
            break
    if app is None:
        raise ApiError(401, "'Issuer' claim ('iss') must be an Integer")
    key = _public_key(app.public_key_pem)
    if key is None:
        raise ApiError(401, "A JSON web token could not be decoded")
    try:
        jwt.decode(token, key, algorithms=["RS256"],
                   options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                            "verify_iss": False, "verify_aud": False})
    except jwt.PyJWTError as exc:
        raise ApiError(401, "A JSON web token could not be decoded") from exc
    now = time.time()
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise ApiError(401, "'Expiration time' claim ('exp') must be a numeric value "
                            "representing the future time at which the assertion expires")
    if not isinstance(iat, int | float) or isinstance(iat, bool):
        raise ApiError(401, "'Issued at' claim ('iat') must be an Integer representing the "
                            "time that the assertion was issued")
    if exp <= now:
        raise ApiError(401, "'Expiration time' claim ('exp') must be a numeric value "
                            "representing the future time at which the assertion expires")
    if exp > now + MAX_JWT_LIFETIME + EXP_SLACK:
        raise ApiError(401, "'Expiration time' claim ('exp') is too far in the future")
    if iat > now + SKEW:
        raise ApiError(401, "'Issued at' claim ('iat') must be an Integer representing the "
                            "time that the assertion was issued")
    return Principal(kind="app", login=app.slug, app=app)


def authenticate(forge: LocalForge, header: str | None) -> Principal:
    if not header:
        return Principal(kind="none")
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() not in ("token", "bearer") or not value:
        raise bad_credentials()
    if _looks_like_jwt(value):
        return verify_jwt(forge, value)
    tok = forge.state.tokens.get(value)
    if tok is None:
        raise bad_credentials()
    if tok.expires_at is not None and forge.clock.now() >= tok.expires_at:
        raise bad_credentials()
    if tok.kind == "user":
        acct = forge.state.account(tok.login or "")
        if acct is None:
            raise bad_credentials()
        if tok.app_id is not None:  # a user access token (ghu_): the user, through the App
            app = forge.state.apps.get(tok.app_id)
            if app is None:
                raise bad_credentials()
            return Principal(kind="user", login=acct.login, token=tok, app=app)
        return Principal(kind="user", login=acct.login, token=tok)
    inst = forge.state.installations.get(tok.installation_id or -1)
    if inst is None or inst.suspended_at is not None:
        raise bad_credentials()
    app = forge.state.apps[inst.app_id]
    return Principal(kind="installation", login=app.bot_login, token=tok, installation=inst,
                     app=app)
