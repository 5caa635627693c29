"""FastAPI app for arith_mcp: the MCP contract (CallToolAction / CallToolObservation)."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

try:
    from .arith_environment import ArithEnvironment
except ImportError:
    from server.arith_environment import ArithEnvironment

app = create_app(ArithEnvironment, CallToolAction, CallToolObservation, env_name="arith_mcp")


def main(host: str = "0.0.0.0", port: int = 8000):
    import uvicorn

    uvicorn.run(app, host=host, port=port)


if __name__ == "__main__":
    main()
