"""HTTP and websocket routers: parse and validate, then call the session layer."""
