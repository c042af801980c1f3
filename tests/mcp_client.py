"""Drives examples/mcp_server.rs with the official Python MCP client.

Run by tests/mcp_python_client.rs (which starts the fake providers, owns
their ledgers and checks them afterwards):

    python mcp_client.py SERVER_BINARY JOURNAL_DIR KILL_MARKER

The provider addresses come in the IDEM_TESTKIT_*_ADDR variables and are
passed on to the server with IDEM_MCP_LOG, its log filter (the client gives
a server a filtered environment; the server's stderr is this script's).
Prints one JSON object, the report, on its last line of stdout; exits
non-zero with the reason on stderr when the client itself sees something
wrong.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SERVER, JOURNAL, MARKER = sys.argv[1], sys.argv[2], sys.argv[3]
RUN = {"idem/run": "order-4711"}
PROVIDER_ENV = {
    k: v
    for k, v in os.environ.items()
    if k.startswith("IDEM_TESTKIT_") or k == "IDEM_MCP_LOG"
}


def server(extra_env=None):
    env = dict(PROVIDER_ENV)
    env.update(extra_env or {})
    return StdioServerParameters(command=SERVER, args=["--journal", JOURNAL], env=env)


def fail(why):
    print(f"mcp_client.py: {why}", file=sys.stderr)
    sys.exit(1)


def outcome(result):
    """A call result as plain data: is_error, structured content, text."""
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    return {
        "is_error": bool(result.is_error),
        "structured": result.structured_content,
        "text": "\n".join(texts),
    }


async def call(session, name, args, meta=RUN):
    return outcome(await session.call_tool(name, args, meta=meta))


ORDER_ID = 4711
EMAIL_ARGS = {
    "to": "ann@example.com",
    "template": "receipt",
    "order_id": ORDER_ID,
    "body": "Hello Ann, we received 49.99 EUR for order 4711. Thank you!",
}


async def first_session(report):
    """Everything but the email, then the email, during which the server
    is killed (IDEM_MCP_KILL_AT)."""
    params = server({"IDEM_MCP_KILL_AT": "send_email", "IDEM_MCP_KILL_MARKER": MARKER})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            report["server_name"] = init.server_info.name
            listed = await session.list_tools()
            report["tools"] = {
                t.name: {
                    "read_only": t.annotations.read_only_hint,
                    "destructive": t.annotations.destructive_hint,
                    "idempotent": t.annotations.idempotent_hint,
                    "required": t.input_schema.get("required", []),
                    "has_description": bool(t.description),
                }
                for t in listed.tools
            }

            report["no_identity"] = await call(session, "lookup_order", {"order_id": ORDER_ID}, meta=None)
            report["bad_arguments"] = await call(session, "lookup_order", {"order_id": "4711"})

            order = await call(session, "lookup_order", {"order_id": ORDER_ID})
            report["lookup"] = order
            if order["is_error"]:
                fail(f"lookup_order failed: {order}")
            order_json = order["structured"]

            report["charge"] = await call(session, "charge", {"order": order_json})
            report["charge_again"] = await call(session, "charge", {"order": order_json})

            ticket_args = {"order_id": ORDER_ID, "topic": "late delivery", "body": "Parcel arrived late."}
            report["ticket"] = await call(session, "open_ticket", ticket_args)
            report["ticket_again"] = await call(session, "open_ticket", ticket_args)

            wire_args = {"order_id": ORDER_ID, "iban": order_json["iban"], "amount_cents": 500}
            # The test made the bank time out after applying the first wire.
            report["wire"] = await call(session, "refund_wire", wire_args)
            report["wire_again"] = await call(session, "refund_wire", wire_args)

            # The server dies once the email has landed, before its COMMIT.
            try:
                crashed = await session.call_tool("send_email", EMAIL_ARGS, meta=RUN, read_timeout_seconds=30)
                report["email_before_crash"] = {"answered": outcome(crashed)}
            except Exception as e:  # the connection closes under the request
                report["email_before_crash"] = {"raised": type(e).__name__, "message": str(e)}


async def second_session(report):
    """The restarted server: the email is recovered, not sent again; the
    rest is replayed."""
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            report["email_after_restart"] = await call(session, "send_email", EMAIL_ARGS)
            report["email_again"] = await call(session, "send_email", EMAIL_ARGS)
            order = await call(session, "lookup_order", {"order_id": ORDER_ID})
            report["charge_after_restart"] = await call(session, "charge", {"order": order["structured"]})


async def main():
    report = {}
    try:
        await first_session(report)
    except Exception as e:
        # The session's teardown after the server died may raise too.
        report.setdefault("first_session_teardown", type(e).__name__)
    if "email_before_crash" not in report:
        fail(f"the first session ended early: {json.dumps(report, default=str)}")
    await second_session(report)
    print(json.dumps(report, default=str))


asyncio.run(main())
