"""mcprl.mcp: specs, sessions over every transport, failure cases, results as text."""

from __future__ import annotations

import base64
import json
import sys
import textwrap

import pytest
from mcp import types as mcp_types

from mcprl.errors import MCPConnectionError, MCPServerError, MCPServerStartError, ServerSpecError
from mcprl.mcp import ServerSpec, inspect_server, load_mcp_config, open_session
from mcprl.mcp._results import tool_result
from tests.helpers import EXAMPLES, fragile_server, load_example, served

pytestmark = pytest.mark.anyio

PY = sys.executable
CALC = f"{PY} {EXAMPLES / 'calculator.py'}"


# -- specs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "transport"),
    [
        ("http://127.0.0.1:8000/mcp", "http"),
        ("https://example.com/mcp/", "http"),
        ("http://127.0.0.1:8000/sse", "sse"),
        ("npx -y @modelcontextprotocol/server-everything", "stdio"),
        ("example:notes", "stdio"),
    ],
)
def test_spec_kinds(text, transport):
    assert ServerSpec.parse(text).transport == transport


def test_spec_command_keeps_quoted_arguments():
    spec = ServerSpec.parse('python server.py --root "My Documents"')
    assert spec.command == ("python", "server.py", "--root", "My Documents")


def test_mcp_config_file(tmp_path):
    cfg = tmp_path / "mcp.json"
    cfg.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "calc": {"command": PY, "args": ["calc.py"], "env": {"A": "1"}},
                    "remote": {"url": "http://127.0.0.1:9000/sse"},
                    "web": {"url": "http://127.0.0.1:9000/mcp", "headers": {"X-Key": "k"}},
                }
            }
        )
    )
    calc = ServerSpec.parse(f"{cfg}#calc")
    assert (calc.transport, calc.command, calc.env) == ("stdio", (PY, "calc.py"), {"A": "1"})
    assert ServerSpec.parse(f"{cfg}#remote").transport == "sse"
    assert load_mcp_config(cfg, "web").headers == {"X-Key": "k"}
    with pytest.raises(ServerSpecError, match=r"defines 3 servers .*#NAME"):
        ServerSpec.parse(str(cfg))
    with pytest.raises(ServerSpecError, match="no server 'nope'; it has: calc, remote, web"):
        ServerSpec.parse(f"{cfg}#nope")


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not valid JSON"), ('{"servers": {}}', "mcpServers"), ("", "not valid JSON")],
)
def test_bad_mcp_config_files(tmp_path, content, message):
    cfg = tmp_path / "bad.json"
    cfg.write_text(content)
    with pytest.raises(ServerSpecError, match=message):
        load_mcp_config(cfg)


def test_unknown_example_server():
    with pytest.raises(ServerSpecError, match="calculator, notes, catalog"):
        ServerSpec.parse("example:weather")


# -- transports ------------------------------------------------------------------------------


async def _check_calculator(server) -> None:
    async with open_session(server) as session:
        names = {t.name for t in await session.list_tools()}
        assert {"add", "multiply", "root", "convert_units"} <= names
        result = await session.call_tool("multiply", {"a": 6, "b": 7})
        assert (result.text, result.is_error) == ("42", False)
        assert "temperature" in await session.read_resource("units://supported")


async def test_in_process_session():
    await _check_calculator(load_example("calculator").server)


async def test_stdio_session():
    await _check_calculator(CALC)


async def test_streamable_http_session():
    with served("calculator") as url:
        await _check_calculator(url)


async def test_sse_session():
    with served("calculator", transport="sse") as url:
        await _check_calculator(url)


async def test_auto_mode_talks_to_a_2x_server_over_http():
    with served("calculator") as url:
        async with open_session(url, mode="auto") as session:
            assert (await session.call_tool("add", {"a": 2, "b": 3})).text == "5"


async def test_servers_built_on_mcp_1x(mcp1_python):
    stdio = f"{mcp1_python} {EXAMPLES / 'calculator.py'}"
    await _check_calculator(stdio)
    with served("calculator", python=mcp1_python) as url:
        await _check_calculator(url)
        async with open_session(url, mode="auto") as session:  # probes, then falls back
            assert (await session.call_tool("add", {"a": 2, "b": 3})).text == "5"


async def test_pagination_is_followed():
    from mcp.server.lowlevel import Server

    all_tools = [
        mcp_types.Tool(name=f"t{i}", description="", input_schema={"type": "object"})
        for i in range(7)
    ]

    async def list_tools(ctx, params):
        start = int(params.cursor) if params and params.cursor else 0
        nxt = str(start + 3) if start + 3 < len(all_tools) else None
        return mcp_types.ListToolsResult(tools=all_tools[start : start + 3], next_cursor=nxt)

    server = Server("paged", on_list_tools=list_tools)
    async with open_session(server) as session:
        assert [t.name for t in await session.list_tools()] == [t.name for t in all_tools]


# -- failures --------------------------------------------------------------------------------


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "server.py"
    path.write_text(textwrap.dedent(body))
    return f"{PY} {path}"


async def test_a_server_that_prints_junk_to_stdout(tmp_path):
    spec = _script(
        tmp_path, "import time\nprint('Starting up v1.2...', flush=True)\ntime.sleep(30)"
    )
    with pytest.raises(MCPServerStartError, match="not MCP JSON-RPC to stdout") as info:
        async with open_session(spec, startup_timeout=2):
            pass
    assert "Starting up v1.2" in str(info.value) and "server.py" in str(info.value)


async def test_a_server_that_exits_during_start_up_shows_its_stderr(tmp_path):
    spec = _script(tmp_path, "import sys\nsys.exit('config file missing: /etc/app.toml')")
    with pytest.raises(MCPServerStartError, match="exited") as info:
        async with open_session(spec):
            pass
    assert info.value.stderr_tail.endswith("config file missing: /etc/app.toml")
    assert "config file missing" in str(info.value)


async def test_a_server_that_hangs_at_start_times_out(tmp_path):
    spec = _script(tmp_path, "import time\ntime.sleep(60)")
    with pytest.raises(MCPServerStartError, match="within 1s"):
        async with open_session(spec, startup_timeout=1):
            pass


async def test_a_command_that_does_not_exist():
    with pytest.raises(MCPServerStartError, match="'/no/such/server' was not found"):
        async with open_session("/no/such/server --port 1"):
            pass


async def test_nothing_listening_at_a_url():
    from tests.helpers import free_port

    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(MCPServerStartError, match="nothing is listening"):
        async with open_session(url):
            pass


async def test_a_server_with_no_tools(tmp_path):
    spec = _script(
        tmp_path,
        f"""
        import sys
        sys.path.insert(0, {str(EXAMPLES)!r})
        from _compat import make_server, serve
        serve(make_server("empty", "nothing here"))
        """,
    )
    with pytest.raises(MCPServerError, match="offers no tools"):
        await inspect_server(spec)


async def test_a_server_that_dies_mid_session_raises_and_a_new_session_works(tmp_path):
    spec = fragile_server(tmp_path)
    with pytest.raises(MCPConnectionError) as info:
        async with open_session(spec) as session:
            assert (await session.call_tool("echo", {"text": "hi"})).text == "hi"
            await session.call_tool("crash", {})
    assert not isinstance(info.value, MCPServerStartError)
    assert "crash" in str(info.value) and "segfault in module foo" in info.value.stderr_tail
    async with open_session(spec) as session:
        assert (await session.call_tool("echo", {"text": "again"})).text == "again"


async def test_tool_errors_come_back_as_text_for_the_agent():
    async with open_session(CALC) as session:
        unknown = await session.call_tool("modulo", {"a": 1, "b": 2})
        bad_args = await session.call_tool("add", {"a": "one", "b": 2})
        raised = await session.call_tool("divide", {"a": 1, "b": 0})
        ok = await session.call_tool("add", {"a": 1, "b": 2})
    assert unknown.is_error and "modulo" in unknown.text and unknown.text.startswith("Error")
    assert bad_args.is_error and bad_args.text.startswith("Error")
    assert raised.is_error and "division by zero" in raised.text
    assert not ok.is_error


async def test_a_slow_tool_times_out_and_the_session_goes_on(tmp_path):
    spec = _script(
        tmp_path,
        f"""
        import sys, time
        sys.path.insert(0, {str(EXAMPLES)!r})
        from _compat import make_server, serve
        server = make_server("slow", "slow")

        @server.tool()
        def wait(seconds: float) -> str:
            \"\"\"Sleep.\"\"\"
            time.sleep(seconds)
            return "done"

        serve(server)
        """,
    )
    async with open_session(spec) as session:
        slow = await session.call_tool("wait", {"seconds": 5}, timeout=0.5)
        assert slow.is_error and "timed out after 0.5s" in slow.text
        assert (await session.call_tool("wait", {"seconds": 0})).text == "done"


# -- results as text ---------------------------------------------------------------------------


def _result(*content, structured=None, is_error=False):
    return mcp_types.CallToolResult(
        content=list(content), structured_content=structured, is_error=is_error
    )


def test_text_parts_are_joined_and_structured_content_is_not_repeated():
    text = mcp_types.TextContent(type="text", text='{"a": 1}')
    assert tool_result(_result(text, structured={"a": 1})).text == '{"a": 1}'
    two = [mcp_types.TextContent(type="text", text=t) for t in ("first", "second")]
    assert tool_result(_result(*two)).text == "first\nsecond"
    only_structured = tool_result(_result(structured={"rows": [1, 2]}))
    assert only_structured.text == '{"rows": [1, 2]}'
    # a returned list: one text part per item, and the list again as {"result": [...]}
    items = [mcp_types.TextContent(type="text", text=json.dumps({"id": i})) for i in (1, 2)]
    listed = tool_result(_result(*items, structured={"result": [{"id": 1}, {"id": 2}]}))
    assert listed.text == '{"id": 1}\n{"id": 2}'


def test_results_as_json_shows_the_structured_content_where_the_text_says_the_same():
    number = _result(mcp_types.TextContent(type="text", text="-160"), structured={"result": -160})
    assert tool_result(number).text == "-160"
    assert tool_result(number, results_as="json").text == '{"result": -160}'
    # where the text says something else, both are shown, whichever is asked for
    other = _result(mcp_types.TextContent(type="text", text="saved"), structured={"id": 7})
    assert tool_result(other, results_as="json").text == 'saved\n{"id": 7}'
    plain = _result(mcp_types.TextContent(type="text", text="no structure"))
    assert tool_result(plain, results_as="json").text == "no structure"


def test_binary_parts_become_placeholders():
    png = base64.b64encode(b"\x89PNG" + bytes(3000)).decode()
    image = mcp_types.ImageContent(type="image", data=png, mime_type="image/png")
    out = tool_result(_result(mcp_types.TextContent(type="text", text="chart:"), image)).text
    assert out == "chart:\n[image: image/png, 2.9 KB]"
    assert png not in out


def test_long_results_are_cut_with_a_marker():
    long = mcp_types.TextContent(type="text", text="x" * 50_000)
    result = tool_result(_result(long), max_chars=1000)
    assert result.truncated and len(result.text) < 1100
    assert result.text.endswith("[output truncated: 49000 of 50000 characters cut]")


def test_error_results_are_flagged_and_prefixed():
    result = tool_result(
        _result(mcp_types.TextContent(type="text", text="disk full"), is_error=True)
    )
    assert (result.text, result.is_error) == ("Error: disk full", True)


GUARDED_SERVER = """
import sys
import uvicorn
sys.path.insert(0, {examples!r})
import calculator

app = calculator.server.streamable_http_app()

async def guarded(scope, receive, send):
    if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != b"Bearer s3cret":
        await send({{"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain")]}})
        await send({{"type": "http.response.body", "body": b"unauthorized"}})
        return
    await app(scope, receive, send)

uvicorn.run(guarded, host="127.0.0.1", port={port}, log_level="warning")
"""


def test_a_header_on_the_command_line_reaches_a_server_that_wants_a_token(tmp_path, capsys):
    """`--header 'Authorization: Bearer …'` is sent with every request; without it the server
    refuses; the token never shows in what mcprl prints."""
    import socket
    import subprocess
    import sys
    import time

    from mcprl.cli import main
    from tests.helpers import EXAMPLES, free_port

    port = free_port()
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED_SERVER.format(examples=str(EXAMPLES), port=port))
    proc = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/mcp"
        assert main(["tools", url, "--header", "Authorization: Bearer s3cret"]) == 0
        out = capsys.readouterr()
        assert "add(" in out.out and "s3cret" not in out.out + out.err
        assert main(["tools", url, "--timeout", "10"]) == 1
        err = capsys.readouterr().err
        assert "it refused a request without credentials (HTTP 401 Unauthorized)" in err
        assert "send its token as a header (--header, e.g. 'Authorization: Bearer TOKEN'" in err
        assert "mcprl login" in err and "--oauth-client-id" in err
        assert main(["tools", url, "--header", "Authorization Bearer x"]) == 2
        assert "write it as 'Name: value'" in capsys.readouterr().err
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_config_file_takes_its_secrets_from_the_environment(tmp_path, monkeypatch):
    cfg = tmp_path / "servers.json"
    cfg.write_text(json.dumps({"mcpServers": {"web": {
        "url": "https://${HOST:-example.com}/mcp",
        "headers": {"Authorization": "Bearer ${env:TOKEN}"},
    }}}))  # fmt: skip
    monkeypatch.setenv("TOKEN", "t0ken")
    spec = load_mcp_config(cfg)
    assert spec.url == "https://example.com/mcp"
    assert spec.headers == {"Authorization": "Bearer t0ken"}
    assert "t0ken" not in repr(spec) and "t0ken" not in spec.describe()
    monkeypatch.delenv("TOKEN")
    with pytest.raises(ServerSpecError, match=r"uses \$\{TOKEN\}, which is not set"):
        load_mcp_config(cfg)
