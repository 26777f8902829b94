"""Create a desktop, act on it, save a screenshot, delete it.

    DESKBOX_URL=http://127.0.0.1:8765 DESKBOX_API_KEY=... python quickstart.py
"""

from __future__ import annotations

from deskbox import Deskbox


def main() -> None:
    with Deskbox() as box, box.sessions.create(start_url="about:blank") as session:
        print("session", session.id, session.state)
        session.key("ctrl+l")
        session.type("data:text/html,<h1>Hello from Deskbox</h1>")
        session.key("Enter")
        result = session.act({"type": "cursor_position"}, screenshot=True)
        print("cursor at", result.results[0])
        session.screenshot(as_image=True).save("quickstart.png")
        print("saved quickstart.png; live view:", session.view_url())


if __name__ == "__main__":
    main()
