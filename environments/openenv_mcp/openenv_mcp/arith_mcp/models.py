"""Observation of a reset: the task to solve (actions are OpenEnv's CallToolAction)."""

from openenv.core.env_server.types import Observation
from pydantic import Field


class TaskObservation(Observation):
    """The arithmetic task the agent must solve with the tools."""

    task: str = Field(default="", description="What to compute")
