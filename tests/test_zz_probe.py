import httpx2, time
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

async def test_probe(embedded):
    tok = embedded.api_tokens["agent:builder"]
    t0=time.monotonic()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {tok}"}) as http:
        async with Client(streamable_http_client(embedded.app_url + "/mcp", http_client=http)) as c:
            tools = await c.list_tools()
            print([t.name for t in tools.tools])
            print(tools.tools[0].input_schema)
            r = await c.call_tool("mail_send", {"to": "scout", "subject": "Hi", "body": "x"})
            print(r.is_error, r.structured_content)
            r = await c.call_tool("mail_send", {"to": "scout"})
            print(r.is_error, r.content)
            p = await c.list_prompts(); print(p)
            print(c.session.protocol_version)
    print("took", time.monotonic()-t0)
