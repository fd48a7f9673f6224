"""mcprl's MCP client under the official conformance suite (`@modelcontextprotocol/conformance`).

    python tests/conformance/client.py SERVER_URL    # as tests/conformance/run.sh runs it

The suite names the scenario in $MCP_CONFORMANCE_SCENARIO and, where it needs them, gives
credentials in $MCP_CONFORMANCE_CONTEXT. This client does what mcprl does with a server: it
opens a session with `mcprl.mcp.open_session`, lists the tools and calls each one with
arguments made from its schema. It authorizes as mcprl does: client credentials
(`OAuthClient`, as `--oauth-client-id`) where the context gives a client secret, else the
authorization-code flow of `mcprl login` (`code_flow`), with the one difference that nobody
is at a browser, so the user's approval is a request to the authorization URL whose redirect
carries the code. A server's questions to the user are answered with their defaults
(`--elicitation accept-defaults`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull

from mcprl.mcp import MemoryTokens, OAuthClient, ServerSpec, code_flow, open_session
from mcprl.mcp._auth import http_auth

REDIRECT_URI = "http://localhost:3030/callback"
# a client ID metadata document, for servers that take one instead of registration (CIMD)
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that fit `schema`: its defaults, else a plain value of each required type."""
    out = {}
    for name, prop in (schema.get("properties") or {}).items():
        if "default" in prop:
            out[name] = prop["default"]
        elif prop.get("enum"):
            out[name] = prop["enum"][0]
        else:
            kind = prop.get("type")
            out[name] = {"integer": 1, "number": 1, "boolean": True, "array": [],
                         "object": {}}.get(kind, "test")  # fmt: skip
    return out


def authorization(url: str, context: dict[str, Any]) -> httpx2.Auth | None:
    if context.get("client_secret") and "client-credentials" in context.get("name", ""):
        client = OAuthClient(client_id=context["client_id"], client_secret=context["client_secret"])
        return http_auth(ServerSpec.parse(url).with_oauth(client))
    storage = MemoryTokens()
    if context.get("client_id"):  # registered beforehand
        storage.client_info = OAuthClientInformationFull(
            client_id=context["client_id"],
            client_secret=context.get("client_secret"),
            redirect_uris=[REDIRECT_URI],
            token_endpoint_auth_method="client_secret_basic" if context.get("client_secret")
            else "none",
        )  # fmt: skip
    approved: dict[str, str] = {}

    async def approve(authorization_url: str) -> None:
        async with httpx2.AsyncClient() as http:
            response = await http.get(authorization_url, follow_redirects=False)
        location = response.headers.get("location", "")
        approved.update({k: v[0] for k, v in parse_qs(urlparse(location).query).items()})

    async def callback() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=approved["code"], state=approved.get("state"),
                                       iss=approved.get("iss"))  # fmt: skip

    return code_flow(url, storage, REDIRECT_URI, approve, callback,
                     client_metadata_url=CLIENT_METADATA_URL)  # fmt: skip


async def main(url: str) -> None:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    auth = authorization(url, context) if scenario.startswith("auth/") else None
    async with open_session(url, auth=auth, elicitation="accept-defaults") as session:
        for tool in await session.list_tools():
            result = await session.call_tool(tool.name, example_arguments(tool.input_schema))
            print(f"{tool.name}: {result.text[:200]}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
