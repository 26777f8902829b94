"""Wire models (pydantic v2) shared by the API, the session layer and the agent's client."""
