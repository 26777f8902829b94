"""Let an OpenAI computer-use model work on a Deskbox desktop (Responses API).

    pip install openai
    OPENAI_API_KEY=... DESKBOX_URL=http://127.0.0.1:8765 DESKBOX_API_KEY=... \
        python openai_agent.py

Without OPENAI_API_KEY, a scripted stand-in plays the model's part, so the example runs
anywhere; the test suite runs it that way.
"""

from __future__ import annotations

import os
from typing import Any

from deskbox import Deskbox
from deskbox.agents import openai as cua

PAGE = ("data:text/html,<title>notes</title><textarea style='position:fixed;inset:0;"
        "font-size:32px' placeholder='Click and type'></textarea>")
TASK = "Write 'Deskbox says hi' in the text area."


class ScriptedModel:
    """Answers like ``openai.OpenAI().responses.create`` would, from a script."""

    def __init__(self) -> None:
        self.responses = self
        self._script: list[dict[str, Any]] = [
            {"type": "click", "button": "left", "x": 400, "y": 300},
            {"type": "type", "text": "Deskbox says hi"},
            {"type": "keypress", "keys": ["ENTER"]},
        ]

    def create(self, **request: Any) -> dict[str, Any]:
        if not self._script:
            text = "I wrote 'Deskbox says hi' in the text area."
            return {"id": "resp_done", "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": text}]}]}
        action = self._script.pop(0)
        return {"id": f"resp_{len(self._script)}", "output": [
            {"type": "computer_call", "call_id": f"call_{len(self._script)}",
             "action": action, "pending_safety_checks": []}]}


def model_client() -> Any:
    if not os.environ.get("OPENAI_API_KEY"):
        return ScriptedModel()
    import openai  # pip install openai

    return openai.OpenAI()


def main() -> None:
    with Deskbox() as box, box.sessions.create(start_url=PAGE) as session:
        tool = cua.ComputerTool(session, environment="browser")
        print("tool:", tool.definition)
        result = cua.run(model_client(), session, TASK, tool=tool, max_steps=20)
        print(f"{result.stop_reason} after {result.steps} steps: {result.text}")
        session.screenshot(as_image=True).save("openai_agent.png")


if __name__ == "__main__":
    main()
