"""The MCP layer and the composition root: reads settings once and builds everything."""
