"""Rubrics: how rollouts are scored."""

from .group import RubricGroup
from . import math_rubric
from .judge import JudgeRubric
from .math_rubric import MathRubric
from .rubric import Rubric

__all__ = ["JudgeRubric", "MathRubric", "Rubric", "RubricGroup", "math_rubric"]
