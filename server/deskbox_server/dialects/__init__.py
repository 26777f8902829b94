"""Vendor dialects of the action API: another tool's input in, that tool's result out.

Each module is pure translation: it validates a vendor's tool input, turns it into a
:class:`~deskbox_server.dialects.plan.Plan` of our actions, and renders the answer in the
vendor's shape. ``api/dialects.py`` runs plans on a session.

- :mod:`.anthropic`: Anthropic's ``computer`` tool (``computer_20250124``, ``computer_20251124``)
- :mod:`.openai`: OpenAI's computer-use ``computer_call`` / ``computer_call_output``
"""

from .plan import Plan

__all__ = ["Plan"]
