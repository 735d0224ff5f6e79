"""DNS for the authentication checks (bot.email.auth), by dnspython. Blocking: the checks run
on a worker thread."""

from __future__ import annotations

import dns.exception
import dns.resolver

from bot.email.auth import DnsError, Resolver

LIFETIME = 5.0


class SystemResolver:
    """The host's resolver. A name or record that does not exist answers []."""

    def __init__(self) -> None:
        self._resolver = dns.resolver.Resolver()
        self._resolver.lifetime = LIFETIME

    def _ask(self, name: str, kind: str) -> list[str]:
        try:
            answer = self._resolver.resolve(name, kind)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.DNSException as exc:  # timeouts, SERVFAIL: try again later
            raise DnsError(f"{kind} {name}: {exc}") from exc
        return [r.to_text() for r in answer]

    def txt(self, name: str) -> list[str]:
        try:
            answer = self._resolver.resolve(name, "TXT")
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.DNSException as exc:
            raise DnsError(f"TXT {name}: {exc}") from exc
        return [b"".join(r.strings).decode("utf-8", "replace") for r in answer]

    def addresses(self, name: str) -> list[str]:
        return self._ask(name, "A") + self._ask(name, "AAAA")

    def mx(self, name: str) -> list[str]:
        return [r.split()[-1].rstrip(".") for r in self._ask(name, "MX")]


class WithRecords:
    """`base`, with TXT records of its own answered first (`{name: [value, ...]}`): the
    embedded app's proof of its own office's email domain (bot.email.domains)."""

    def __init__(self, base: Resolver, txts: dict[str, list[str]]) -> None:
        self.base, self.txts = base, {k.lower(): v for k, v in txts.items()}

    def txt(self, name: str) -> list[str]:
        found = self.txts.get(name.lower().rstrip("."))
        return list(found) if found is not None else self.base.txt(name)

    def addresses(self, name: str) -> list[str]:
        return self.base.addresses(name)

    def mx(self, name: str) -> list[str]:
        return self.base.mx(name)
