"""Key names as models write them (xdotool style and common aliases) → X keysyms.

The vocabulary of the `key` actions is the agent's own table
(``deskbox_agent.desktop.keys``, shipped in deskbox-server): the dialects check combos with
it before anything runs, so the host refuses exactly what the agent could not press. Here
its refusals become the server's InvalidAction (422).
"""

from __future__ import annotations

from deskbox_agent.desktop import keys as _agent_keys
from deskbox_agent.desktop.errors import InvalidAction as _AgentInvalidAction

from .errors import InvalidAction

__all__ = [
    "MODIFIER_KEYSYMS", "char_keysym", "key_name", "off_layout_char", "parse_combo", "parse_key",
]

MODIFIER_KEYSYMS = _agent_keys.MODIFIER_KEYSYMS
char_keysym = _agent_keys.char_keysym
off_layout_char = _agent_keys.off_layout_char
key_name = _agent_keys.key_name


def parse_key(name: str) -> int:
    try:
        return _agent_keys.parse_key(name)
    except _AgentInvalidAction as error:
        raise InvalidAction(error.message) from None


def parse_combo(keys: str) -> list[int]:
    try:
        return _agent_keys.parse_combo(keys)
    except _AgentInvalidAction as error:
        raise InvalidAction(error.message) from None
