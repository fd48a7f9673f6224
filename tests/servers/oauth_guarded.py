"""The example calculator behind OAuth 2.1, with its own authorization server, for tests.

    python tests/servers/oauth_guarded.py PORT [TOKEN_LIFETIME_S]

One process is both the resource server (`/mcp`, which wants a bearer token it issued and that
has not expired, and answers 401 with `WWW-Authenticate: Bearer resource_metadata=…` otherwise)
and its authorization server:

- metadata: `/.well-known/oauth-protected-resource/mcp` (RFC 9728) and
  `/.well-known/oauth-authorization-server` (RFC 8414);
- `/register`: dynamic client registration (RFC 7591), public clients;
- `/authorize`: approves at once and redirects back with a code (no user to ask in a test);
- `/token`: `client_credentials` for the pre-registered client `mcprl-ci` (secret `s3cret`,
  HTTP Basic or in the form), `authorization_code` with PKCE (S256), and `refresh_token`;
- `/stats`: how many tokens each grant issued and how many requests were refused.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
import calculator

PORT = int(sys.argv[1])
LIFETIME = int(sys.argv[2]) if len(sys.argv) > 2 else 3600
BASE = f"http://127.0.0.1:{PORT}"
CLIENTS = {"mcprl-ci": "s3cret"}  # pre-registered confidential clients
TOKENS: dict[str, float] = {}  # access token -> expiry
REFRESH: dict[str, str] = {}  # refresh token -> client id
CODES: dict[str, dict] = {}
STATS = {"client_credentials": 0, "authorization_code": 0, "refresh_token": 0, "refused": 0,
         "registered": 0}  # fmt: skip


def _issue(grant: str, client_id: str, refresh: bool) -> JSONResponse:
    STATS[grant] += 1
    token = secrets.token_urlsafe(16)
    TOKENS[token] = time.time() + LIFETIME
    body = {"access_token": token, "token_type": "Bearer", "expires_in": LIFETIME,
            "scope": "calc"}  # fmt: skip
    if refresh:
        body["refresh_token"] = secrets.token_urlsafe(16)
        REFRESH[body["refresh_token"]] = client_id
    return JSONResponse(body)


def _error(error: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=status)


async def protected_resource(request: Request) -> Response:
    return JSONResponse({"resource": f"{BASE}/mcp", "authorization_servers": [BASE],
                         "scopes_supported": ["calc"]})  # fmt: skip


async def authorization_server(request: Request) -> Response:
    return JSONResponse({
        "issuer": BASE, "authorization_endpoint": f"{BASE}/authorize",
        "token_endpoint": f"{BASE}/token", "registration_endpoint": f"{BASE}/register",
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "response_types_supported": ["code"], "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post",
                                                  "none"],
        "scopes_supported": ["calc"],
    })  # fmt: skip


async def register(request: Request) -> Response:
    meta = await request.json()
    STATS["registered"] += 1
    return JSONResponse({**meta, "client_id": f"dyn-{secrets.token_hex(4)}",
                         "client_id_issued_at": int(time.time())}, status_code=201)  # fmt: skip


async def authorize(request: Request) -> Response:
    q = request.query_params
    if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
        return _error("invalid_request")
    code = secrets.token_urlsafe(12)
    CODES[code] = {"challenge": q["code_challenge"], "client_id": q.get("client_id"),
                   "redirect_uri": q.get("redirect_uri")}  # fmt: skip
    back = {"code": code, "state": q.get("state", ""), "iss": BASE}
    return RedirectResponse(f"{q['redirect_uri']}?{urlencode(back)}", status_code=302)


def _client(request: Request, form: dict) -> tuple[str | None, str | None]:
    auth = request.headers.get("authorization", "")
    if auth.startswith("Basic "):
        from urllib.parse import unquote

        user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        return unquote(user), unquote(password)
    return form.get("client_id"), form.get("client_secret")


async def token(request: Request) -> Response:
    form = dict(await request.form())
    grant = form.get("grant_type")
    client_id, secret = _client(request, form)
    if grant == "client_credentials":
        if CLIENTS.get(client_id or "") != secret:
            return _error("invalid_client", 401)
        return _issue(grant, client_id, refresh=False)
    if grant == "authorization_code":
        pending = CODES.pop(form.get("code", ""), None)
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        if pending is None or challenge.decode().rstrip("=") != pending["challenge"]:
            return _error("invalid_grant")
        return _issue(grant, pending["client_id"], refresh=True)
    if grant == "refresh_token":
        owner = REFRESH.pop(form.get("refresh_token", ""), None)
        if owner is None:
            return _error("invalid_grant")
        return _issue(grant, owner, refresh=True)
    return _error("unsupported_grant_type")


async def stats(request: Request) -> Response:
    return JSONResponse(STATS)


mcp_app = calculator.server.streamable_http_app()


async def guarded(scope, receive, send):
    if scope["type"] == "http":
        auth = dict(scope["headers"]).get(b"authorization", b"").decode()
        expiry = TOKENS.get(auth.removeprefix("Bearer "), 0) if auth.startswith("Bearer ") else 0
        if expiry < time.time():
            STATS["refused"] += 1
            challenge = (f'Bearer resource_metadata="{BASE}/.well-known/oauth-protected-resource'
                         f'/mcp", scope="calc"')  # fmt: skip
            response = JSONResponse({"error": "invalid_token"}, status_code=401,
                                    headers={"WWW-Authenticate": challenge})  # fmt: skip
            await response(scope, receive, send)
            return
    await mcp_app(scope, receive, send)


app = Starlette(
    routes=[
        Route("/.well-known/oauth-protected-resource/mcp", protected_resource),
        Route("/.well-known/oauth-protected-resource", protected_resource),
        Route("/.well-known/oauth-authorization-server", authorization_server),
        Route("/register", register, methods=["POST"]),
        Route("/authorize", authorize),
        Route("/token", token, methods=["POST"]),
        Route("/stats", stats),
        Mount("/", app=guarded),
    ],
    lifespan=lambda app: mcp_app.router.lifespan_context(app),
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
