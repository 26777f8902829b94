"""Wire models (pydantic v2) shared by the API and the desktop driver."""
