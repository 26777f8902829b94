"""Agent adapters: a vendor model's computer tool, run against a Deskbox session.

- :mod:`deskbox.agents.anthropic`: Anthropic's ``computer`` tool (Messages API, beta)
- :mod:`deskbox.agents.openai`: OpenAI's computer-use tool (Responses API)

Each has a ``ComputerTool`` (the tool definition, and ``execute`` for one tool call, for
your own loop) and ``run`` (a whole loop). The model client is duck-typed: the vendors'
SDKs work as they are, and neither is a dependency of this package.
"""

from __future__ import annotations

from . import anthropic, openai
from ._common import DEFAULT_MAX_PIXELS, ActionError, RunResult, fit_display

__all__ = ["DEFAULT_MAX_PIXELS", "ActionError", "RunResult", "anthropic", "fit_display", "openai"]
