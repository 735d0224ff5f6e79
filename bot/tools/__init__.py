"""The tools of DESIGN §3.5: one implementation each, served over HTTP (and MCP, shell)."""

from bot.tools.registry import TOOLS, Call, call_tool

__all__ = ["TOOLS", "Call", "call_tool"]
