"""Who really sent a message: SPF (RFC 7208), DKIM (RFC 6376, by dkimpy) and DMARC (RFC 7489)
verdicts. No I/O of its own: every DNS lookup goes through the `Resolver` it is given, so the
tests run offline and the app asks DNS (bot.email.dns) from a worker thread.

Kept small on purpose. SPF: `all`, `ip4`, `ip6`, `a`, `mx`, `include`, `exists` and
`redirect=`, ten lookups at most; a term with macros (`%{...}`) and `ptr` never match. DMARC:
the record at `_dmarc.<From domain>`, else at its organisational domain (by the Public Suffix
List, private suffixes too), relaxed or strict alignment (`aspf`, `adkim`), and the policy
`p=` (`sp=` for a subdomain).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import dkim
from publicsuffixlist import PublicSuffixList


class DnsError(Exception):
    """A lookup that could not be answered now (a timeout, SERVFAIL): a temporary error."""


class Resolver(Protocol):
    """DNS as the checks need it; a name that does not exist answers [] (not an error)."""

    def txt(self, name: str) -> list[str]: ...

    def addresses(self, name: str) -> list[str]: ...  # A and AAAA

    def mx(self, name: str) -> list[str]: ...  # exchange host names


@dataclass(frozen=True)
class Verdicts:
    """The three results, each `pass`, `fail`, `softfail` (SPF), `neutral` (SPF), `none`,
    `temperror` or `permerror`, with what they were about."""

    spf: str
    spf_domain: str
    dkim: str
    dkim_domains: tuple[str, ...]  # the d= of each signature that verified
    dmarc: str
    dmarc_policy: str  # none | quarantine | reject | "" (no record)
    from_domain: str
    # an SPF or DKIM pass for the From domain (relaxed alignment), with or without a DMARC
    # record: what an allow-list needs before it believes a From
    aligned: bool = False
    # When the From is proven by DKIM alone (no aligned SPF pass): the header names (lower
    # case) the aligned signatures that verified cover (their h=), and whether one covers the
    # whole body (no l=, or one past the body's end). None when SPF proves the From (the
    # message came from a server the domain lists: all of it is the domain's) or nothing does
    # (then nothing in it is believed as the sender's). Not recorded: the listener's alone.
    signed: tuple[str, ...] | None = field(default=None, compare=False)
    body_signed: bool = field(default=True, compare=False)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["dkim_domains"] = list(self.dkim_domains)
        del data["signed"], data["body_signed"]
        return data

    def unsigned(self, present: Iterable[str]) -> list[str]:
        """Of the headers `present` (as the message writes their names), the ones the
        signatures proving the From do not cover: anyone who has the signed message can add
        them and it still passes (RFC 6376 5.4). [] unless the From rests on DKIM alone."""
        if self.signed is None:
            return []
        return [name for name in present if name.lower() not in self.signed]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdicts:
        return cls(spf=str(data["spf"]), spf_domain=str(data["spf_domain"]),
                   dkim=str(data["dkim"]), dkim_domains=tuple(data["dkim_domains"]),
                   dmarc=str(data["dmarc"]), dmarc_policy=str(data["dmarc_policy"]),
                   from_domain=str(data["from_domain"]), aligned=bool(data.get("aligned")))

    def summary(self) -> str:
        """One line a person reads."""
        dkim_part = self.dkim + (f" (d={', '.join(self.dkim_domains)})"
                                 if self.dkim_domains else "")
        policy = f" (p={self.dmarc_policy})" if self.dmarc_policy else ""
        return (f"SPF {self.spf} ({self.spf_domain or 'no domain'}), DKIM {dkim_part}, "
                f"DMARC {self.dmarc}{policy} for {self.from_domain or 'no From domain'}")


# -- SPF ---------------------------------------------------------------------------------------

MAX_LOOKUPS = 10


class _PermError(Exception):
    pass


class _TempError(Exception):
    pass


def _spf_record(resolver: Resolver, domain: str) -> str | None:
    try:
        records = [r for r in resolver.txt(domain) if r.lower().startswith("v=spf1")
                   and (len(r) == 6 or r[6] == " ")]
    except DnsError as exc:
        raise _TempError(str(exc)) from exc
    if len(records) > 1:
        raise _PermError(f"{domain} publishes {len(records)} SPF records")
    return records[0] if records else None


def _split_cidr(spec: str, default_domain: str) -> tuple[str, int | None, int | None]:
    """`a`/`mx` arguments: [:domain][/cidr4][//cidr6]."""
    domain, v4, v6 = default_domain, None, None
    if spec.startswith(":"):
        spec = spec[1:]
        m = re.match(r"^([^/]*)(.*)$", spec)
        assert m is not None
        domain, spec = m.group(1) or default_domain, m.group(2)
    m = re.match(r"^(?:/(\d+))?(?://(\d+))?$", spec)
    if m is None:
        raise _PermError(f"bad a/mx argument {spec!r}")
    if m.group(1):
        v4 = int(m.group(1))
    if m.group(2):
        v6 = int(m.group(2))
    return domain, v4, v6


def _in(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, addresses: list[str],
        v4: int | None, v6: int | None) -> bool:
    for text in addresses:
        try:
            other = ipaddress.ip_address(text)
        except ValueError:
            continue
        if other.version != ip.version:
            continue
        prefix = v4 if other.version == 4 else v6
        bits = prefix if prefix is not None else other.max_prefixlen
        net = ipaddress.ip_network(f"{other}/{bits}", strict=False)
        if ip in net:
            return True
    return False


_QUALIFIERS = {"+": "pass", "-": "fail", "~": "softfail", "?": "neutral"}


def _spf_eval(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, domain: str,
              resolver: Resolver, lookups: list[int]) -> str:
    record = _spf_record(resolver, domain)
    if record is None:
        return "none"
    redirect: str | None = None

    def count() -> None:
        lookups[0] += 1
        if lookups[0] > MAX_LOOKUPS:
            raise _PermError(f"more than {MAX_LOOKUPS} DNS lookups")

    def lookup(fn: Any, name: str) -> list[str]:
        try:
            found: list[str] = fn(name)
            return found
        except DnsError as exc:
            raise _TempError(str(exc)) from exc

    for term in record.split()[1:]:
        lower = term.lower()
        if lower.startswith("redirect="):
            redirect = term.split("=", 1)[1]
            continue
        if "=" in lower.split(":", 1)[0]:  # another modifier (exp=): ignored
            continue
        qualifier = "pass"
        if term[0] in _QUALIFIERS:
            qualifier, term, lower = _QUALIFIERS[term[0]], term[1:], lower[1:]
        name, _, arg = lower.partition(":")
        name = name.split("/", 1)[0]
        if "%" in term:  # macros are not expanded: such a term never matches
            continue
        matched = False
        if name == "all":
            matched = True
        elif name in ("ip4", "ip6"):
            try:
                matched = ip in ipaddress.ip_network(arg, strict=False)
            except ValueError as exc:
                raise _PermError(f"bad {name} argument {arg!r}") from exc
        elif name in ("a", "mx"):
            count()
            target, v4, v6 = _split_cidr(term[len(name):], domain)
            if name == "a":
                matched = _in(ip, lookup(resolver.addresses, target), v4, v6)
            else:
                hosts = lookup(resolver.mx, target)[:10]
                matched = any(_in(ip, lookup(resolver.addresses, h), v4, v6) for h in hosts)
        elif name == "include":
            count()
            inner = _spf_eval(ip, term.split(":", 1)[1], resolver, lookups)
            if inner == "none":
                raise _PermError(f"include:{arg} has no SPF record")
            matched = inner == "pass"
        elif name == "exists":
            count()
            matched = bool(lookup(resolver.addresses, term.split(":", 1)[1]))
        elif name == "ptr":
            count()  # not evaluated (RFC 7208 says do not use it): never matches
        else:
            raise _PermError(f"unknown mechanism {name!r}")
        if matched:
            return qualifier
    if redirect is not None:
        count()
        result = _spf_eval(ip, redirect, resolver, lookups)
        if result == "none":
            raise _PermError(f"redirect={redirect} has no SPF record")
        return result
    return "neutral"


def check_spf(ip: str, domain: str, resolver: Resolver) -> str:
    """The SPF result for `ip` sending as `domain` (the MAIL FROM's, or the HELO name's)."""
    if not domain:
        return "none"
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return "permerror"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    try:
        return _spf_eval(address, domain.lower().rstrip("."), resolver, [0])
    except _TempError:
        return "temperror"
    except _PermError:
        return "permerror"


# -- DKIM --------------------------------------------------------------------------------------

MAX_SIGNATURES = 5


@dataclass(frozen=True)
class Signature:
    """A DKIM signature that verified: its d=, the headers its h= names (lower case), and
    whether it covers the whole body (an l= shorter than the body leaves the rest anyone's)."""
    domain: str
    headers: frozenset[str]
    whole_body: bool


def check_dkim(message: bytes, resolver: Resolver) -> tuple[str, tuple[str, ...]]:
    """`pass` and the d= domains of the signatures that verified, `fail`, `temperror`, or
    `none` (no signature)."""
    result, passed = dkim_signatures(message, resolver)
    return result, tuple(dict.fromkeys(s.domain for s in passed))


def _whole_body(d: dkim.DKIM) -> bool:
    length = d.signature_fields.get(b"l")
    if length is None:
        return True
    policy = dkim.CanonicalizationPolicy.from_c_value(
        d.signature_fields.get(b"c", b"simple/simple"))
    return int(length) >= len(policy.canonicalize_body(d.body))


def dkim_signatures(message: bytes, resolver: Resolver) -> tuple[str, list[Signature]]:
    """`check_dkim`'s result, and each signature that verified."""
    signatures = len(re.findall(rb"(?im)^DKIM-Signature:", message))
    if signatures == 0:
        return "none", []
    temp = False

    def dnsfunc(name: bytes, timeout: int = 5) -> bytes:
        nonlocal temp
        try:
            return "".join(resolver.txt(name.decode("ascii", "replace").rstrip("."))
                           [:1]).encode()
        except DnsError:
            temp = True
            return b""

    passed: list[Signature] = []
    for idx in range(min(signatures, MAX_SIGNATURES)):
        try:  # (the message is taken apart as the object is made: a malformed one raises)
            d = dkim.DKIM(message, minkey=1024)
            ok = d.verify(idx=idx, dnsfunc=dnsfunc)
        except dkim.DKIMException:
            ok = False
        if ok and d.domain:
            passed.append(Signature(
                d.domain.decode("ascii", "replace").lower(),
                frozenset(h.decode("ascii", "replace") for h in d.include_headers),
                _whole_body(d)))
    if passed:
        return "pass", passed
    return ("temperror" if temp else "fail"), []


# -- DMARC -------------------------------------------------------------------------------------

@functools.cache
def _suffixes() -> PublicSuffixList:
    """The Public Suffix List as publicsuffixlist ships it (ICANN's and private suffixes:
    `github.io`'s customers are organisations of their own), read once (80 ms)."""
    return PublicSuffixList()


def organisational(domain: str) -> str:
    """`domain`'s organisational domain (RFC 7489 §3.2): its public suffix and one label
    more; a public suffix itself stands for itself."""
    name = domain.lower().rstrip(".")
    return _suffixes().privatesuffix(name) or name


def _aligned(a: str, b: str, mode: str) -> bool:
    a, b = a.lower().rstrip("."), b.lower().rstrip(".")
    return a == b if mode == "s" else organisational(a) == organisational(b)


def _dmarc_record(resolver: Resolver, domain: str) -> dict[str, str] | None:
    found = [r for r in resolver.txt(f"_dmarc.{domain}") if r.lower().startswith("v=dmarc1")]
    if len(found) != 1:
        return None
    tags: dict[str, str] = {}
    for part in found[0].split(";"):
        key, _, value = part.strip().partition("=")
        if key:
            tags[key.strip().lower()] = value.strip().lower()
    return tags


def dmarc_record(from_domain: str, resolver: Resolver) -> tuple[dict[str, str] | None, bool]:
    """The DMARC record that applies to `from_domain` (its tags; None when there is none),
    and whether it is its organisational domain's (then `sp=` applies). DnsError when DNS
    cannot say now."""
    tags = _dmarc_record(resolver, from_domain)
    if tags is None and organisational(from_domain) != from_domain:
        return _dmarc_record(resolver, organisational(from_domain)), True
    return tags, False


def _dmarc_result(record: tuple[dict[str, str] | None, bool], from_domain: str, spf: str,
                  spf_domain: str, dkim_result: str,
                  dkim_domains: tuple[str, ...]) -> tuple[str, str]:
    tags, subdomain = record
    if tags is None:
        return "none", ""
    policy = tags.get("sp", tags.get("p", "none")) if subdomain else tags.get("p", "none")
    if policy not in ("none", "quarantine", "reject"):
        policy = "none"
    spf_ok = spf == "pass" and _aligned(spf_domain, from_domain, tags.get("aspf", "r"))
    dkim_ok = dkim_result == "pass" and any(
        _aligned(d, from_domain, tags.get("adkim", "r")) for d in dkim_domains)
    return ("pass" if spf_ok or dkim_ok else "fail"), policy


def check_dmarc(from_domain: str, spf: str, spf_domain: str, dkim_result: str,
                dkim_domains: tuple[str, ...], resolver: Resolver) -> tuple[str, str]:
    """(`pass` | `fail` | `none` | `temperror` | `permerror`, the policy that applies)."""
    if not from_domain:
        return "permerror", ""
    try:
        record = dmarc_record(from_domain, resolver)
    except DnsError:
        return "temperror", ""
    return _dmarc_result(record, from_domain, spf, spf_domain, dkim_result, dkim_domains)


# -- all three ---------------------------------------------------------------------------------

def authenticate(message: bytes, *, ip: str, helo: str, mail_from: str, from_domain: str,
                 resolver: Resolver) -> Verdicts:
    """The verdicts on `message` as it arrived: from `ip`, after `HELO helo`, with the
    envelope sender `mail_from` (empty for a bounce: then the HELO name is checked), claiming
    to be from `from_domain` (its From header's)."""
    # The From domain's DMARC record first: the lookups after it name domains the sender
    # chooses (its MAIL FROM's SPF, up to five signatures' keys), and one deadline covers
    # them all (bot.email.server). Looked up last, a forger whose own DNS answered slowly
    # had it meet the deadline: `temperror` for a forged From, not the `fail` it was.
    record: tuple[dict[str, str] | None, bool] | None = None
    dmarc, policy = "permerror", ""
    if from_domain:
        try:
            record = dmarc_record(from_domain, resolver)
        except DnsError:
            dmarc = "temperror"
    spf_domain = mail_from.rpartition("@")[2].lower() if mail_from else helo.lower()
    spf = check_spf(ip, spf_domain, resolver)
    dkim_result, passed = dkim_signatures(message, resolver)
    dkim_domains = tuple(dict.fromkeys(s.domain for s in passed))
    if record is not None:
        dmarc, policy = _dmarc_result(record, from_domain, spf, spf_domain, dkim_result,
                                      dkim_domains)
    spf_aligned = bool(from_domain) and spf == "pass" and _aligned(spf_domain, from_domain, "r")
    proving = [s for s in passed if from_domain and _aligned(s.domain, from_domain, "r")]
    # the From proven by DKIM alone: what those signatures cover is all that is the sender's
    signed = None if spf_aligned or not proving else tuple(sorted(
        frozenset[str]().union(*(s.headers for s in proving))))
    return Verdicts(spf=spf, spf_domain=spf_domain, dkim=dkim_result, dkim_domains=dkim_domains,
                    dmarc=dmarc, dmarc_policy=policy, from_domain=from_domain.lower(),
                    aligned=spf_aligned or bool(proving), signed=signed,
                    body_signed=signed is None or any(s.whole_body for s in proving))
