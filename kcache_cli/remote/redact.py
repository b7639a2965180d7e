"""Passwords out of everything kcache prints: the one redaction every output path uses (a store's
`url`, error lines, --debug tracebacks, JSON).

A URL carries a password in its user part (`redis://:pw@h`, `redis://user:pw@h`, with `@`, `/`, `?`
or `#` inside it, encoded or not) or in its query (`?password=pw`, which redis-py honours). The user
part ends at the `@` before the host: the last `@` that a host follows (`@host[:port]`, then `/`, `?`,
`#` or the end). Whatever lies between `://` and that `@` is hidden whole (an unencoded `@` or `/`
makes the user part ambiguous, so no part of it is kept), and so is the value of every query parameter
but a few known harmless ones. An `@` in a path that no host follows (an image pinned by digest,
`oci://h/team/k@sha256:…`) ends no user part, and a URL whose authority is empty (`file:///…`) has
none."""

from __future__ import annotations

import re

HIDDEN = "***"
# Query parameters redis-py reads that never hold a secret: their values stay readable.
_HARMLESS = frozenset({"db", "socket_timeout", "socket_connect_timeout", "socket_keepalive", "retry_on_timeout",
                       "max_connections", "health_check_interval", "client_name", "protocol", "ssl_cert_reqs",
                       "decode_responses", "encoding"})
# A URL inside some text: a scheme, `://`, then everything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
# The `@` that ends a user part: a host follows it (a name, or an IPv6 literal, and a port of at most 5 digits),
# then the path, query, fragment or the end. `@sha256:<64 hex>` is no host and port.
_USER_END = re.compile(r"@(?:\[[^\]/?#@]*\]|[^/?#@:\[\]]*)(?::\d{0,5})?(?=[/?#]|$)")


def lower_scheme(url: str) -> str:
    """`url` with its scheme in lower case, as RFC 3986 reads it (`OCI+HTTP://h/r` is `oci+http://h/r`);
    anything else in it is kept as written."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}://{rest}" if sep and scheme.isascii() else url


def redact_url(url: str) -> str:
    """`url` with its password hidden, in any form a URL can carry one."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _redact_query(url)
    ends = [] if rest.startswith("/") else [m.start() for m in _USER_END.finditer(rest)]
    if ends:
        rest = HIDDEN + rest[ends[-1]:]
    return f"{scheme}://{_redact_query(rest)}"


def _redact_query(rest: str) -> str:
    head, q, query = rest.partition("?")
    if not q:
        return rest
    query, hash_, _fragment = query.partition("#")
    parts = []
    for param in query.split("&"):
        name, eq, _value = param.partition("=")
        parts.append(param if not eq or name.lower() in _HARMLESS else f"{name}={HIDDEN}")
    return f"{head}?{'&'.join(parts)}" + (f"#{HIDDEN}" if hash_ else "")


def redact_text(text: str) -> str:
    """`text` (an error line, a traceback) with every URL in it redacted."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
