"""Rubrics: how rollouts are scored."""

from .group import RubricGroup
from .judge import JudgeRubric, MathRubric
from .rubric import Rubric

__all__ = ["JudgeRubric", "MathRubric", "Rubric", "RubricGroup"]
