"""The ``docker`` engine: each session a container made through the Docker Engine API
(engine.py)."""
