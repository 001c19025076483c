"""traceq for coding agents: an MCP server (`traceq mcp`) whose tools are traceq's commands,
called through the Python API, with JSON schemas made from the API's signatures, results as
bounded JSON records and errors as the same one-line text the CLI prints (docs/agents.md)."""
