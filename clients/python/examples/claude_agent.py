"""Let Claude work on a Deskbox desktop through Anthropic's computer tool.

    pip install anthropic
    ANTHROPIC_API_KEY=... DESKBOX_URL=http://127.0.0.1:8765 DESKBOX_API_KEY=... \
        python claude_agent.py

Without ANTHROPIC_API_KEY, a scripted stand-in plays the model's part (a screenshot, a
click, some typing), so the example runs anywhere; the test suite runs it that way.
"""

from __future__ import annotations

import os
from typing import Any

from deskbox import Deskbox
from deskbox.agents import anthropic as claude

PAGE = ("data:text/html,<title>notes</title><textarea style='position:fixed;inset:0;"
        "font-size:32px' placeholder='Click and type'></textarea>")
TASK = "Write 'Deskbox says hi' in the text area."


class ScriptedClaude:
    """Answers like ``anthropic.Anthropic().beta.messages.create`` would, from a script."""

    def __init__(self) -> None:
        self.beta = self
        self.messages = self
        self._script: list[list[dict[str, Any]]] = [
            [{"type": "tool_use", "id": "toolu_1", "name": "computer",
              "input": {"action": "screenshot"}}],
            [{"type": "tool_use", "id": "toolu_2", "name": "computer",
              "input": {"action": "left_click", "coordinate": [400, 300]}}],
            [{"type": "tool_use", "id": "toolu_3", "name": "computer",
              "input": {"action": "type", "text": "Deskbox says hi"}}],
            [{"type": "text", "text": "I wrote 'Deskbox says hi' in the text area."}],
        ]

    def create(self, **request: Any) -> dict[str, Any]:
        last = request["messages"][-1]["content"]
        if isinstance(last, list):  # the tool results of the previous step
            print("tool results:", [r.get("is_error", False) for r in last])
        return {"role": "assistant", "content": self._script.pop(0)}


def model_client() -> Any:
    if not os.environ.get("ANTHROPIC_API_KEY"):
        return ScriptedClaude()
    import anthropic  # pip install anthropic

    return anthropic.Anthropic()


def main() -> None:
    with Deskbox() as box, box.sessions.create(start_url=PAGE) as session:
        tool = claude.ComputerTool(session)  # told the display size, scaled if big
        print("tool:", tool.definition)
        result = claude.run(model_client(), session, TASK, tool=tool, max_steps=20)
        print(f"{result.stop_reason} after {result.steps} steps: {result.text}")
        session.screenshot(as_image=True).save("claude_agent.png")


if __name__ == "__main__":
    main()
