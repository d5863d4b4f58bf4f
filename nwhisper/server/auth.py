"""Access control: one shared token, presented as `Authorization: Bearer T` (or `Token T`, as
Deepgram's clients send it) or `?token=T` (or, by a browser's WebSocket, which cannot set headers,
as the subprotocol `openai-insecure-api-key.T` or Deepgram's `token, T`).

    problem(request, token)    → None when the request may proceed, else the 401 message
    is_loopback("0.0.0.0")     → False: the bind that deserves a warning when there is no token

The comparison is hmac.compare_digest on the UTF-8 bytes, so its time does not depend on how
much of a guess was right. `/health` and the test page stay open (the page has a field for the
token, kept in the browser's localStorage); everything else, the WebSocket included, asks.
The OpenAI client sends its api_key as a Bearer token, so `OpenAI(api_key=T)` just works.
"""

from __future__ import annotations

import hmac
import ipaddress

SUBPROTOCOL_KEY = "openai-insecure-api-key."     # OpenAI's browser form of the key


def presented(request):
    """The token the request carries, or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() in ("bearer", "token") and value.strip():     # Token: Deepgram's clients
        return value.strip()
    values = request.query_arguments.get("token")
    if values:
        return values[-1].decode("utf-8", "replace")
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    for p in offered:
        if p.startswith(SUBPROTOCOL_KEY) and len(p) > len(SUBPROTOCOL_KEY):
            return p[len(SUBPROTOCOL_KEY):]
    if len(offered) == 2 and offered[0].lower() == "token" and offered[1]:
        return offered[1]                    # Deepgram's browser form: "token, KEY"
    return None


def problem(request, token):
    """None if `token` is unset or the request presents it; otherwise why not, as a sentence."""
    if not token:
        return None
    given = presented(request)
    if given is None:
        return ("missing token: this server requires 'Authorization: Bearer <token>' "
                "or '?token=<token>'")
    if not hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
        return "wrong token"
    return None


def is_loopback(host):
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False            # a hostname other than localhost: assume it is reachable
